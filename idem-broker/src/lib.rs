//! Idempotent consumers on the brokers users already run — NATS
//! JetStream, RabbitMQ and Redis Streams: each message's handler runs under
//! idem's `execute`, keyed by the message id, and the delivery is acked
//! only after the outcome is recorded.
//!
//! Every broker delivers at least once. JetStream redelivers after its ack
//! wait and takes a late ack from whoever sends it; RabbitMQ redelivers
//! what a closed channel held; Redis Streams keep an entry pending until
//! someone claims it. Their dedupe windows (JetStream's `Nats-Msg-Id`
//! window: two minutes by default) are far shorter than producer retries.
//! A [`Consumer`] closes the gap on any idem store:
//!
//! ```
//! use std::time::Duration;
//! use idem_broker::{Consumer, ConsumerConfig, HandlerError, Message};
//! use idem_core::{Idempotent, MemoryStore};
//!
//! let idem = Idempotent::new(MemoryStore::new()).with_retention(Duration::from_secs(7 * 86_400));
//! let consumer = Consumer::new(idem).with_config(ConsumerConfig::default().with_max_deliveries(5));
//! let handler = |message: Message| async move {
//!     if message.payload.is_empty() {
//!         return Err(HandlerError::permanent("empty order")); // dead letter at once
//!     }
//!     Ok(()) // charge, email, …: once per message id
//! };
//! # let _ = (consumer, handler);
//! // consumer.run(source, handler, shutdown).await — with a source below.
//! ```
//!
//! The loop is written once ([`consumer`]); a broker is a [`Source`] of
//! [`Delivery`]s: [`nats::JetStreamSource`], [`amqp::AmqpSource`],
//! [`streams::RedisStreamSource`] (features `nats`, `amqp`,
//! `redis-streams`, all on by default). Each module says what its broker
//! guarantees, what idem adds, and carries a short example.
//!
//! # What a delivery costs
//!
//! On the idem store: 2 round trips for a first delivery (claim, record),
//! 1 for a redelivery or duplicate of a recorded message (the replay),
//! plus one renewal per third of the lease while a long handler runs. On
//! the broker: one ack (JetStream's is confirmed), plus one in-progress
//! ack or idle reset per heartbeat.
//!
//! # Decisions where the design is silent
//!
//! * The request idem fingerprints is the SHA-256 of the payload: the same
//!   id with another body is a mismatch and goes to the dead letters.
//! * Redeliveries that meet another consumer's live lease are handed back
//!   for the time left on it, and count as deliveries toward
//!   [`ConsumerConfig::max_deliveries`].
//! * A consumer whose idem lease was taken over while it stalled settles
//!   nothing ([`Outcome::Abandoned`]): the newer owner settles its own
//!   delivery, and the message's effect is at most once per lease (the
//!   stalled handler's own effect may have happened; an effect in a remote
//!   API should carry a key derived from the message key).
//! * The effect of a handler killed between its side effect and the record
//!   can happen again on the redelivery: idem makes it once per lease, not
//!   once (see idem-core's exactly-once rules).
//! * idem's retention should outlast the span over which a message can be
//!   redelivered or republished.
#![forbid(unsafe_code)]

#[cfg(feature = "amqp")]
pub mod amqp;
pub mod consumer;
pub mod delivery;
mod error;
pub mod handler;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis-streams")]
pub mod streams;

pub use consumer::{Consumer, ConsumerConfig, KeyFn, Outcome, Stats};
pub use delivery::{Delivery, Source};
pub use error::BrokerError;
pub use handler::{Handler, HandlerError, Message};
pub use idem_inbox::Backoff;

#[cfg(feature = "nats")]
pub use async_nats;
#[cfg(feature = "amqp")]
pub use lapin;
#[cfg(feature = "redis-streams")]
pub use redis;
