//! Kafka: a consumer group as a [`Source`](crate::Source), and a
//! producer that carries the idem key.
//!
//! ```no_run
//! use idem_broker::kafka::{KafkaPublisher, KafkaSource, KeyFrom};
//! use idem_broker::rdkafka::ClientConfig;
//! use idem_broker::{Consumer, Message};
//! use idem_core::Idempotent;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let mut config = ClientConfig::new();
//! config.set("bootstrap.servers", "127.0.0.1:9092");
//! // Producers publish with the idem key in a header, idempotent on.
//! let publisher = KafkaPublisher::new(config.clone(), "orders")?;
//! publisher.send("order-7f3a", br#"{"amount":1250}"#).await?;
//! // The group "billing" reads "orders"; poison goes to "orders.dead".
//! config.set("group.id", "billing");
//! let source = KafkaSource::builder(config, "orders")
//!     .with_key(KeyFrom::header("idem-key"))
//!     .with_dead_letter_topic("orders.dead")
//!     .start()?;
//! let store = idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let consumer = Consumer::new(Idempotent::new(store));
//! let handler = |message: Message| async move {
//!     println!("charging {}", message.key); // keyed by the idem-key header
//!     Ok::<(), idem_broker::HandlerError>(())
//! };
//! consumer.run(source, handler, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```
//!
//! **What Kafka guarantees:** a consumer group reads each partition from
//! its committed offset; a message whose offset was not committed when
//! its consumer died or lost the partition in a rebalance is read again
//! by the next owner. An idempotent producer (`enable.idempotence`) drops
//! its own retries within one producer session, and transactions tie a
//! consume-transform-produce loop together — inside Kafka only. A handler
//! that charges a card and is killed before its commit charges again on
//! the re-read, and a producer that restarts, or that a caller retries
//! after a lost ack, publishes the same event again at a new offset.
//!
//! **What idem adds:** one handler run per key — a header the producer
//! sets (the default, [`KEY_HEADER`], what [`KafkaPublisher`] writes),
//! the message key, or a field of the payload; the message's position
//! only when chosen explicitly ([`KeyFrom::Position`]), since a
//! duplicate publish has a new offset. Offsets are committed only after
//! the outcome is recorded, and never past a message still unsettled;
//! partitions revoked in a rebalance wait for their running handlers and
//! commit before they go; retries with backoff; a delivery limit and a
//! dead-letter topic that keeps the reason.
//!
//! **Failures the tests reproduce** (`tests/brokers`): duplicate publishes,
//! from the same and from a new producer session; consumers killed with
//! SIGKILL mid-handler; a rebalance while handlers run; poison and
//! always-failing messages; the inbox publishing to Kafka.
//!
//! # Decisions
//!
//! * **Commits are per partition and contiguous.** Kafka keeps one offset
//!   per partition, not one ack per message: handlers finish out of order,
//!   so the source commits the offset after the longest run of settled
//!   messages from the partition's start, never past an unsettled one. A
//!   crash re-reads the settled messages after that point; idem replays
//!   them at one store round trip each.
//! * **Commits are batched**: at most every
//!   [`commit_interval`](KafkaSourceBuilder::with_commit_interval) (default
//!   100 ms), asynchronously, and synchronously when partitions are
//!   revoked and when the source is dropped. An ack is therefore final
//!   for idem at once and for Kafka a moment later.
//! * **Retries stay in this consumer.** Kafka cannot redeliver one message;
//!   a retry holds the message in memory for its delay and hands it out
//!   again, its offset uncommitted meanwhile (so a crash or a rebalance
//!   re-reads it from Kafka). The delivery count is this consumer's: a
//!   message re-read after a crash starts again at 1, and the delivery
//!   limit bounds the attempts of one consumer.
//! * **Rebalances drain.** When partitions are revoked, the source stops
//!   handing out their messages, waits up to the
//!   [`revoke_grace`](KafkaSourceBuilder::with_revoke_grace) (default 10 s) for the
//!   handlers running on them, commits what settled and lets them go. A
//!   handler still running then settles nothing: the new owner re-reads the
//!   message, meets this handler's live idem lease, waits it out, and
//!   replays the outcome.
//! * **librdkafka runs on a thread of its own**, which polls, commits and
//!   serves rebalance callbacks; messages reach the consumer loop through a
//!   channel of [`prefetch`](KafkaSourceBuilder::with_prefetch) slots (default 64).
//!   A rebalance callback may block that thread while it drains; it never
//!   blocks the async runtime.
//! * **rdkafka** (librdkafka, built from its bundled source) is the
//!   client: it has consumer groups with manual commits, rebalance
//!   callbacks, headers and the idempotent producer. Debian's
//!   `librdkafka-dev` (2.0.2) is older than the 2.12.1 that rdkafka 0.39
//!   links against, its `cmake-build` fails on librdkafka 2.12.1 without
//!   curl, and the pure-Rust clients lack consumer groups or commits.
//!   Build times are in `dev/idem-bench/notes/2026-12-03-kafka.md`.

mod offsets;
mod publisher;
mod source;

use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message as _};

use crate::BrokerError;

pub use publisher::KafkaPublisher;
pub use source::{KafkaSource, KafkaSourceBuilder};

const BROKER: &str = "kafka";

/// The header that carries the idem key, as [`KafkaPublisher`] writes it
/// and [`KeyFrom::default`] reads it.
pub const KEY_HEADER: &str = "idem-key";
/// The header of a dead letter that carries its reason.
pub const REASON_HEADER: &str = "idem-dead-letter-reason";
/// The header of a dead letter that names where it was read:
/// `topic/partition/offset`.
pub const ORIGIN_HEADER: &str = "idem-origin";

fn broken(e: KafkaError) -> BrokerError {
    BrokerError::broker(BROKER, e)
}

/// Where a message's idem key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyFrom {
    /// A header (UTF-8), such as an event id the producer set.
    Header(String),
    /// The Kafka message key (UTF-8).
    MessageKey,
    /// A field of a JSON payload, by JSON pointer (`/event/id`); a string
    /// or a number.
    PayloadField(String),
    /// `topic/partition/offset`: dedupes re-reads after a crash or a
    /// rebalance, **not** duplicate publishes (each has a new offset). For
    /// messages that carry nothing better only.
    Position,
}

impl KeyFrom {
    /// The header `name`.
    pub fn header(name: impl Into<String>) -> KeyFrom {
        KeyFrom::Header(name.into())
    }

    /// The JSON payload's field at `pointer` (`/id`, `/event/id`).
    pub fn payload_field(pointer: impl Into<String>) -> KeyFrom {
        KeyFrom::PayloadField(pointer.into())
    }

    pub(super) fn extract(&self, message: &BorrowedMessage<'_>) -> Option<String> {
        let text = |bytes: &[u8]| std::str::from_utf8(bytes).ok().map(str::to_owned);
        match self {
            KeyFrom::Header(name) => message
                .headers()?
                .iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value)
                .and_then(text),
            KeyFrom::MessageKey => message.key().and_then(text),
            KeyFrom::PayloadField(pointer) => {
                let value: serde_json::Value = serde_json::from_slice(message.payload()?).ok()?;
                match value.pointer(pointer)? {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Number(n) => Some(n.to_string()),
                    _ => None,
                }
            }
            KeyFrom::Position => Some(format!(
                "{}/{}/{}",
                message.topic(),
                message.partition(),
                message.offset()
            )),
        }
    }
}

impl Default for KeyFrom {
    /// The [`KEY_HEADER`] header.
    fn default() -> KeyFrom {
        KeyFrom::header(KEY_HEADER)
    }
}
