//! Redis Streams: a consumer group as a [`Source`].
//!
//! ```no_run
//! use idem_broker::{redis, streams::RedisStreamSource, Consumer, Message};
//! use idem_core::Idempotent;
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! // Entries carry the fields `id` and `payload` (see `publish`).
//! let source = RedisStreamSource::new(&client, "orders", "billing", "worker-1")
//!     .await?
//!     .with_claim_idle(Duration::from_secs(30));
//! let store = idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let consumer = Consumer::new(Idempotent::new(store));
//! let handler = |message: Message| async move {
//!     println!("invoicing {}", message.key);
//!     Ok::<(), idem_broker::HandlerError>(())
//! };
//! consumer.run(source, handler, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```
//!
//! **What Redis Streams guarantee:** an entry read by a consumer of a
//! group stays pending for it until `XACK`; `XCLAIM` moves it to another
//! consumer and counts a delivery. Nothing redelivers by itself, nothing
//! dedupes, and `XACK` does not look at who holds the entry.
//!
//! **What idem adds:** one handler run per `id` field; claiming of
//! entries idle past the claim idle time (a dead consumer's); settles
//! fenced on the entry's owner and delivery count; idle resets while a
//! handler runs; a delivery limit and a dead-letter stream with reasons.
//!
//! **Failures the tests reproduce** (`tests/brokers`): the ack withheld
//! until the entry is claimed; a stalled consumer's late `XACK`; an entry
//! without an id; duplicate publishes; poison and always-failing messages;
//! consumers killed with SIGKILL mid-handler.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamClaimReply, StreamId, StreamReadReply};
use redis::{Script, Value};

use crate::delivery::{Delivery, Source};
use crate::BrokerError;

const BROKER: &str = "redis-streams";

/// The entry field that carries the message id.
pub const ID_FIELD: &str = "id";
/// The entry field that carries the body.
pub const PAYLOAD_FIELD: &str = "payload";
/// The field of a dead letter that carries its reason.
pub const REASON_FIELD: &str = "reason";

fn broken(e: redis::RedisError) -> BrokerError {
    BrokerError::broker(BROKER, e)
}

/// Adds a message to `stream` as this source reads it: fields
/// [`ID_FIELD`] and [`PAYLOAD_FIELD`]. Returns the entry id.
pub async fn publish(
    connection: &mut MultiplexedConnection,
    stream: &str,
    id: &str,
    payload: &[u8],
) -> Result<String, BrokerError> {
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg(ID_FIELD)
        .arg(id)
        .arg(PAYLOAD_FIELD)
        .arg(payload)
        .query_async(connection)
        .await
        .map_err(broken)
}

/// A consumer of a Redis Streams consumer group handing out deliveries.
///
/// Streams keep a delivered entry pending for its consumer until it is
/// acked, however long that takes; nothing redelivers it by itself. This
/// source therefore claims, before reading new entries, entries that have
/// been pending (for any consumer of the group) longer than the claim idle
/// time (`XPENDING … IDLE` then `XCLAIM`, which counts a delivery), and
/// resets the idle time of its running deliveries every third of it
/// (`XCLAIM … JUSTID`, which does not). A retry leaves the entry pending
/// with its idle time set so it is claimed again after the delay.
///
/// **A retry waits at most the claim idle time.** Redis keeps no delivery
/// time in the future (`XCLAIM … TIME` in the future is taken as now), so
/// a pending entry can be held back only by making it look less idle: a
/// delay longer than the claim idle time is cut to it, whatever the
/// backoff or the handler's `Retry-After` asked. Where retries must wait
/// their full delay, set the claim idle time
/// ([`with_claim_idle`](RedisStreamSource::with_claim_idle)) to at least
/// the backoff's cap — at the price that a dead consumer's entries wait
/// as long before another consumer takes them. The delivery limit counts
/// these shorter waits as they come.
///
/// Every settle (ack, retry, dead letter, idle reset) is one Lua script
/// fenced on the entry still being pending **for this consumer at this
/// delivery count**: a consumer that stalled and lost the entry to another
/// settles nothing. Dead letters go, with a [`REASON_FIELD`], to the
/// dead-letter stream in the same script (so under Redis Cluster the two
/// stream names must share a hash tag).
pub struct RedisStreamSource {
    read: MultiplexedConnection,
    settle: MultiplexedConnection,
    stream: String,
    group: String,
    consumer: String,
    claim_idle: Duration,
    dead_letters: String,
    batch: usize,
    last_claim: Option<Instant>,
    buffer: VecDeque<(StreamId, u32)>,
    script: Arc<Script>,
}

impl fmt::Debug for RedisStreamSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamSource")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .field("consumer", &self.consumer)
            .field("claim_idle", &self.claim_idle)
            .field("dead_letters", &self.dead_letters)
            .finish_non_exhaustive()
    }
}

impl RedisStreamSource {
    /// Reads `stream` as `consumer` of `group`, creating the group (from
    /// the stream's start) and the stream if they do not exist. Dead
    /// letters go to `<stream>:dead` unless
    /// [`with_dead_letter_stream`](RedisStreamSource::with_dead_letter_stream)
    /// says otherwise; entries idle 30 s are claimed from their consumer.
    /// Two connections are opened: a blocking read must not hold up acks.
    pub async fn new(
        client: &redis::Client,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> Result<RedisStreamSource, BrokerError> {
        let mut read = client
            .get_multiplexed_async_connection()
            .await
            .map_err(broken)?;
        let settle = client
            .get_multiplexed_async_connection()
            .await
            .map_err(broken)?;
        let created: Result<(), redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut read)
            .await;
        match created {
            Ok(()) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(broken(e)),
        }
        Ok(RedisStreamSource {
            read,
            settle,
            stream: stream.to_owned(),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
            claim_idle: Duration::from_secs(30),
            dead_letters: format!("{stream}:dead"),
            batch: 16,
            last_claim: None,
            buffer: VecDeque::new(),
            script: Arc::new(Script::new(include_str!("fenced.lua"))),
        })
    }

    /// Claims entries pending longer than `idle` (default 30 s, at least
    /// 10 ms): how long a dead consumer's entries wait before another takes
    /// them.
    pub fn with_claim_idle(mut self, idle: Duration) -> RedisStreamSource {
        self.claim_idle = idle.max(Duration::from_millis(10));
        self
    }

    /// Sends dead letters to `stream`.
    pub fn with_dead_letter_stream(mut self, stream: impl Into<String>) -> RedisStreamSource {
        self.dead_letters = stream.into();
        self
    }

    /// Reads up to `n` entries per request (default 16).
    pub fn with_batch(mut self, n: usize) -> RedisStreamSource {
        self.batch = n.max(1);
        self
    }

    fn millis(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    /// Claims entries idle past the claim idle time into the buffer.
    async fn claim_idle_entries(&mut self) -> Result<(), BrokerError> {
        let idle = Self::millis(self.claim_idle);
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.group)
            .arg("IDLE")
            .arg(idle)
            .arg("-")
            .arg("+")
            .arg(self.batch)
            .query_async(&mut self.settle)
            .await
            .map_err(broken)?;
        if pending.is_empty() {
            return Ok(());
        }
        let mut claim = redis::cmd("XCLAIM");
        claim
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(idle);
        for (id, ..) in &pending {
            claim.arg(id);
        }
        let claimed: StreamClaimReply =
            claim.query_async(&mut self.settle).await.map_err(broken)?;
        for entry in claimed.ids {
            // XCLAIM counted this delivery: one more than XPENDING showed.
            let count = pending
                .iter()
                .find(|(id, ..)| *id == entry.id)
                .map_or(1, |(.., n)| n + 1);
            self.buffer
                .push_back((entry, u32::try_from(count).unwrap_or(u32::MAX)));
        }
        Ok(())
    }

    async fn read_new(&mut self, wait: Duration) -> Result<(), BrokerError> {
        let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.batch)
            .arg("BLOCK")
            .arg(Self::millis(wait).max(1))
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(&mut self.read)
            .await
            .map_err(broken)?;
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                self.buffer.push_back((entry, 1));
            }
        }
        Ok(())
    }
}

fn field_bytes(entry: &StreamId, name: &str) -> Option<Vec<u8>> {
    match entry.map.get(name)? {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(text) => Some(text.clone().into_bytes()),
        _ => None,
    }
}

#[async_trait]
impl Source for RedisStreamSource {
    async fn next(&mut self, wait: Duration) -> Result<Option<Box<dyn Delivery>>, BrokerError> {
        if self.buffer.is_empty() {
            let due = self
                .last_claim
                .is_none_or(|at| at.elapsed() >= self.claim_idle / 4);
            if due {
                self.last_claim = Some(Instant::now());
                self.claim_idle_entries().await?;
            }
        }
        if self.buffer.is_empty() {
            self.read_new(wait).await?;
        }
        let Some((entry, count)) = self.buffer.pop_front() else {
            return Ok(None);
        };
        let id = field_bytes(&entry, ID_FIELD).and_then(|b| String::from_utf8(b).ok());
        let payload = field_bytes(&entry, PAYLOAD_FIELD).unwrap_or_default();
        Ok(Some(Box::new(StreamDelivery {
            connection: self.settle.clone(),
            script: self.script.clone(),
            stream: self.stream.clone(),
            group: self.group.clone(),
            consumer: self.consumer.clone(),
            dead_letters: self.dead_letters.clone(),
            claim_idle: self.claim_idle,
            entry: entry.id,
            id,
            payload,
            count,
        })))
    }

    fn heartbeat(&self) -> Option<Duration> {
        Some(self.claim_idle / 3)
    }
}

struct StreamDelivery {
    connection: MultiplexedConnection,
    script: Arc<Script>,
    stream: String,
    group: String,
    consumer: String,
    dead_letters: String,
    claim_idle: Duration,
    entry: String,
    id: Option<String>,
    payload: Vec<u8>,
    count: u32,
}

impl fmt::Debug for StreamDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamDelivery")
            .field("stream", &self.stream)
            .field("entry", &self.entry)
            .field("id", &self.id)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl StreamDelivery {
    /// Runs the fenced settle `action`; `Ok(false)` when this consumer no
    /// longer holds the entry at this delivery.
    async fn fenced(
        &self,
        action: &str,
        argument: u64,
        fields: &[&[u8]],
    ) -> Result<bool, BrokerError> {
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(&self.stream)
            .key(&self.dead_letters)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(&self.entry)
            .arg(self.count)
            .arg(action)
            .arg(argument);
        for field in fields {
            invocation.arg(*field);
        }
        let mut connection = self.connection.clone();
        let applied: i64 = invocation
            .invoke_async(&mut connection)
            .await
            .map_err(broken)?;
        Ok(applied == 1)
    }

    fn lost(&self, what: &str) -> BrokerError {
        BrokerError::Protocol {
            broker: BROKER,
            reason: format!(
                "cannot {what} entry {} of {}: another consumer claimed it since",
                self.entry, self.stream
            ),
        }
    }
}

#[async_trait]
impl Delivery for StreamDelivery {
    fn message_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn delivery_count(&self) -> u32 {
        self.count
    }

    fn locator(&self) -> String {
        format!("{}#{}", self.stream, self.entry)
    }

    async fn ack(&self) -> Result<(), BrokerError> {
        if self.fenced("ack", 0, &[]).await? {
            Ok(())
        } else {
            Err(self.lost("ack"))
        }
    }

    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        let idle = self.claim_idle.saturating_sub(delay);
        let idle = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
        if self.fenced("retry", idle, &[]).await? {
            Ok(())
        } else {
            Err(self.lost("retry"))
        }
    }

    async fn dead_letter(&self, reason: &str) -> Result<(), BrokerError> {
        let id = self.id.as_deref().unwrap_or("");
        let fields: [&[u8]; 6] = [
            ID_FIELD.as_bytes(),
            id.as_bytes(),
            PAYLOAD_FIELD.as_bytes(),
            &self.payload,
            REASON_FIELD.as_bytes(),
            reason.as_bytes(),
        ];
        if self.fenced("dead", 0, &fields).await? {
            Ok(())
        } else {
            Err(self.lost("dead-letter"))
        }
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        if self.fenced("touch", 0, &[]).await? {
            Ok(())
        } else {
            Err(self.lost("keep alive"))
        }
    }
}
