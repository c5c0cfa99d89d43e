//! Idempotent consumers on the brokers users already run — NATS
//! JetStream, RabbitMQ, Redis Streams and Kafka: each message's handler
//! runs under idem's `execute`, keyed by the message id, and the delivery
//! is acked (on Kafka: its offset committed) only after the outcome is
//! recorded.
//!
//! Every broker delivers at least once. JetStream redelivers after its ack
//! wait and takes a late ack from whoever sends it; RabbitMQ redelivers
//! what a closed channel held; Redis Streams keep an entry pending until
//! someone claims it; Kafka re-reads from the last committed offset after
//! a crash or a rebalance. Their dedupe windows (JetStream's `Nats-Msg-Id`
//! window: two minutes by default; Kafka's idempotent producer: one
//! producer session) are far shorter than producer retries.
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
//! `redis-streams`, all on by default) and `kafka::KafkaSource` (feature
//! `kafka`, off by default: it builds librdkafka from its C source,
//! five minutes and more on two cores, which a user of the other brokers
//! should not pay; `dev/idem-bench/notes/2026-12-03-kafka.md`).
//! Each module says what its broker guarantees, what idem adds, and
//! carries a short example.
//!
//! # TLS
//!
//! [`nats::connect`] and [`amqp::connect`] take `tls://` and `amqps://`
//! URLs with a private CA and a client certificate in the query, on
//! rustls and ring as the whole workspace (the `tls` feature, on by
//! default, turns on lapin's rustls, and redis-rs's for `rediss://`).
//! Kafka's `security.protocol=SSL` and SASL/SCRAM settings pass through
//! the `ClientConfig` to librdkafka, which needs OpenSSL for them: the
//! `kafka-tls` feature links it.
//!
//! # What a delivery costs
//!
//! On the idem store: 2 round trips for a first delivery (claim, record),
//! 1 for a redelivery or duplicate of a recorded message (the replay),
//! plus one renewal per third of the lease while a long handler runs. On
//! the broker: one ack (JetStream's is confirmed), plus one in-progress
//! ack or idle reset per heartbeat; on Kafka, one offset commit per
//! partition per commit interval (100 ms), whatever the messages.
//!
//! # Decisions where the design is silent
//!
//! * The request idem fingerprints is the SHA-256 of the payload: the same
//!   id with another body is a mismatch and goes to the dead letters.
//! * Redeliveries that meet another consumer's live lease are handed back
//!   for the time left on it. The broker counts them as deliveries, but
//!   past [`ConsumerConfig::max_deliveries`] the consumer reads the key's
//!   record before parking a message: one whose key is still held is
//!   handed back again, one whose outcome is recorded is replayed and
//!   acked. A duplicate publish that waits out a long handler therefore
//!   does not end in the dead letters.
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
//!
//! # Tests and the failures they reproduce
//!
//! `tests/brokers` runs every case on the real brokers (NATS with
//! JetStream, RabbitMQ, Redis, and with the `kafka` feature a
//! Kafka-protocol broker — Tansu in CI; found through `IDEM_NATS_URL`,
//! `IDEM_AMQP_URL`, `IDEM_REDIS_URL`, `IDEM_KAFKA_URL` (`host:port`,
//! default `127.0.0.1:9092`); skipped with a reason when one is missing,
//! failed under `CI`), each on fresh stream, queue, topic and key names:
//!
//! | test | failure reproduced |
//! |---|---|
//! | `duplicate_publishes_run_once_on_every_broker` | a producer retry after the broker's dedupe window |
//! | `a_withheld_ack_is_redelivered_and_replayed_on_every_broker` | the outcome recorded, the ack lost (ack wait lapses, entry claimed, connection closed) |
//! | `a_late_ack_from_a_stalled_consumer_settles_nothing_on_jetstream_and_streams` | a consumer stalled past ack wait and lease acks late while another handles the redelivery |
//! | `poison_messages_are_dead_lettered_on_every_broker` | a permanent error; an error on every delivery |
//! | `a_failed_message_is_retried_until_it_succeeds_on_every_broker` | a transient error, retried with backoff |
//! | `a_message_without_an_id_is_dead_lettered_unrun` | an entry with no id to key it by |
//! | `shutdown_lets_running_handlers_finish_on_every_broker` | shutdown in the middle of a handler |
//! | `consumers_killed_mid_handler_lose_nothing_and_run_nothing_twice_on_every_broker` | consumers (child processes) killed with SIGKILL mid-handler while every message is published twice |
//! | `kafka::a_duplicate_from_a_new_producer_session_makes_one_effect` | a producer restarted (a new idempotent-producer session) publishing the same events again |
//! | `kafka::a_rebalance_mid_handler_loses_nothing_and_runs_nothing_twice` | a consumer joining the group while another is in the middle of its handlers |
//!
//! The kill test scales with `IDEM_BROKER_KILLS` (default 5) and
//! `IDEM_BROKER_MESSAGES` (default 40). Its handler charges through an API
//! that dedupes on the message key, as idem-core says an effect in a
//! remote API should; the test asserts every message's charge was made,
//! nothing is left on the broker or in the dead letters, and the handler
//! calls stay within the messages plus what the kills interrupted (a
//! consumer without idem makes at least twice the messages).
//!
//! # Behind idem-inbox's webhook receiver
//!
//! The brokers take the place of the inbox's table queue on the
//! receiving side (on Kafka, through `kafka::KafkaPublisher`): [`enqueue::Enqueuer`] is an [`idem_inbox::Enqueue`]
//! that publishes each verified event, confirmed, once per (source, event
//! id) for three days (idem's store remembers what was published; the
//! brokers' own dedupe windows are minutes or nothing), and this crate's
//! [`Consumer`] handles the events, keyed by the same id. A broker is not
//! an `idem_inbox::queue::Queue` for the inbox's `Worker`: the
//! [`enqueue`] module says which parts of that contract none of them can
//! honour. One example per broker is there.
#![forbid(unsafe_code)]

#[cfg(feature = "amqp")]
pub mod amqp;
pub mod consumer;
pub mod delivery;
pub mod enqueue;
mod error;
pub mod handler;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis-streams")]
pub mod streams;
#[cfg(any(feature = "nats", feature = "amqp"))]
mod tls;

pub use consumer::{Consumer, ConsumerConfig, KeyFn, Outcome, Stats};
pub use delivery::{Delivery, Source};
pub use error::BrokerError;
pub use handler::{Handler, HandlerError, Message};

#[cfg(feature = "nats")]
pub use async_nats;
#[cfg(feature = "amqp")]
pub use lapin;
#[cfg(feature = "kafka")]
pub use rdkafka;
#[cfg(feature = "redis-streams")]
pub use redis;
