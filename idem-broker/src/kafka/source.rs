//! The consumer-group member: librdkafka on a thread of its own, the
//! rebalance callbacks, and the deliveries.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::message::{Header, Message as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::offsets::{Owned, Polled, Slot, Tracker};
use super::publisher::producer;
use super::{broken, KeyFrom, BROKER, KEY_HEADER, ORIGIN_HEADER, REASON_HEADER};
use crate::delivery::{Delivery, Source};
use crate::BrokerError;

#[derive(Debug)]
struct Shared {
    tracker: Mutex<Tracker>,
    settled: Condvar,
    stopping: AtomicBool,
    /// Set by the librdkafka thread after its last commit.
    finished: Mutex<bool>,
    finishing: Condvar,
    topic: String,
    revoke_grace: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn commit_list(&self, commits: BTreeMap<i32, i64>) -> Option<TopicPartitionList> {
        if commits.is_empty() {
            return None;
        }
        let mut list = TopicPartitionList::new();
        for (partition, offset) in commits {
            // Offsets come from the broker: always in range.
            let _ = list.add_partition_offset(&self.topic, partition, Offset::Offset(offset));
        }
        Some(list)
    }
}

/// The consumer context: rebalance callbacks drain and commit.
struct Context {
    shared: Arc<Shared>,
}

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else {
            return;
        };
        let revoked: Vec<i32> = list
            .elements_for_topic(&self.shared.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        let deadline = Instant::now() + self.shared.revoke_grace;
        let mut tracker = self.shared.lock();
        for partition in &revoked {
            if let Some(owned) = tracker.owned.get_mut(partition) {
                owned.revoking = true;
            }
        }
        tracker
            .retries
            .retain(|(_, p)| !revoked.contains(&p.partition));
        // Running handlers on the revoked partitions finish and settle,
        // unless the source is going away (their consumer loop has stopped).
        while !self.shared.stopping.load(Ordering::Relaxed) {
            let running: usize = revoked
                .iter()
                .filter_map(|p| tracker.owned.get(p))
                .map(Owned::handed)
                .sum();
            let left = deadline.saturating_duration_since(Instant::now());
            if running == 0 || left.is_zero() {
                if running > 0 {
                    tracing::warn!(running, "handlers still running when their partitions were revoked settle nothing; the new owner re-reads their messages");
                }
                break;
            }
            tracker = self
                .shared
                .settled
                .wait_timeout(tracker, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let commits: BTreeMap<i32, i64> = revoked
            .iter()
            .filter_map(|p| tracker.to_commit.remove(p).map(|o| (*p, o)))
            .collect();
        for partition in &revoked {
            tracker.owned.remove(partition);
        }
        drop(tracker);
        if let Some(list) = self.shared.commit_list(commits) {
            if let Err(error) = consumer.commit(&list, CommitMode::Sync) {
                tracing::warn!(%error, "could not commit the revoked partitions' offsets; their settled messages are read again and replayed");
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            let mut tracker = self.shared.lock();
            for element in list.elements_for_topic(&self.shared.topic) {
                tracker.assign(element.partition());
            }
        }
    }

    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(error) = result {
            tracing::warn!(%error, "an offset commit failed; settled messages after the last commit are read again and replayed");
        }
    }
}

/// A Kafka consumer-group member handing out deliveries of one topic.
///
/// Built from the application's [`ClientConfig`] (`bootstrap.servers`,
/// `group.id`, and whatever else it sets: `session.timeout.ms`,
/// security); the source sets `enable.auto.commit=false` and
/// `enable.auto.offset.store=false` over it, and
/// `auto.offset.reset=earliest` unless the application set it. The module
/// docs say how offsets, retries and rebalances go.
pub struct KafkaSource {
    shared: Arc<Shared>,
    messages: mpsc::Receiver<Polled>,
    producer: FutureProducer,
    dead_letters: String,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topic", &self.shared.topic)
            .field("dead_letters", &self.dead_letters)
            .finish_non_exhaustive()
    }
}

/// How the librdkafka thread runs, fixed before it starts.
#[derive(Debug, Clone)]
struct Settings {
    key: KeyFrom,
    prefetch: usize,
    commit_interval: Duration,
}

impl KafkaSource {
    /// Joins the group `group.id` of `config` on `topic`. Dead letters go
    /// to `<topic>.dead` unless
    /// [`with_dead_letter_topic`](KafkaSource::with_dead_letter_topic) says
    /// otherwise; keys come from the [`KEY_HEADER`] header unless
    /// [`with_key`](KafkaSourceBuilder::with_key) says otherwise.
    /// Reading starts at once; [`builder`](KafkaSource::builder) takes
    /// the options that shape it first.
    pub fn new(config: ClientConfig, topic: &str) -> Result<KafkaSource, BrokerError> {
        KafkaSource::builder(config, topic).start()
    }

    /// A source with its reading options still open.
    pub fn builder(config: ClientConfig, topic: &str) -> KafkaSourceBuilder {
        KafkaSourceBuilder {
            config,
            topic: topic.to_owned(),
            settings: Settings {
                key: KeyFrom::default(),
                prefetch: 64,
                commit_interval: Duration::from_millis(100),
            },
            dead_letters: format!("{topic}.dead"),
            revoke_grace: Duration::from_secs(10),
        }
    }

    /// Sends dead letters to `topic`.
    pub fn with_dead_letter_topic(mut self, topic: impl Into<String>) -> KafkaSource {
        self.dead_letters = topic.into();
        self
    }
}

/// Options of a [`KafkaSource`] that shape how it reads, set before it
/// starts.
#[derive(Debug)]
pub struct KafkaSourceBuilder {
    config: ClientConfig,
    topic: String,
    settings: Settings,
    dead_letters: String,
    revoke_grace: Duration,
}

impl KafkaSourceBuilder {
    /// Takes each message's key as `key` says (default: the [`KEY_HEADER`]
    /// header).
    pub fn with_key(mut self, key: KeyFrom) -> KafkaSourceBuilder {
        self.settings.key = key;
        self
    }

    /// Holds up to `n` messages read ahead of the handlers (default 64, at
    /// least 1). Give it at least twice the consumer's concurrency.
    pub fn with_prefetch(mut self, n: usize) -> KafkaSourceBuilder {
        self.settings.prefetch = n.max(1);
        self
    }

    /// Commits settled offsets at most this often (default 100 ms).
    pub fn with_commit_interval(mut self, every: Duration) -> KafkaSourceBuilder {
        self.settings.commit_interval = every;
        self
    }

    /// How long revoked partitions wait for their running handlers
    /// (default 10 s). Keep it under the group's rebalance timeout
    /// (`max.poll.interval.ms`).
    pub fn with_revoke_grace(mut self, grace: Duration) -> KafkaSourceBuilder {
        self.revoke_grace = grace;
        self
    }

    /// Sends dead letters to `topic` (default `<topic>.dead`).
    pub fn with_dead_letter_topic(mut self, topic: impl Into<String>) -> KafkaSourceBuilder {
        self.dead_letters = topic.into();
        self
    }

    /// Joins the group and starts reading.
    pub fn start(self) -> Result<KafkaSource, BrokerError> {
        let KafkaSourceBuilder {
            mut config,
            topic,
            settings,
            dead_letters,
            revoke_grace,
        } = self;
        if config.get("group.id").is_none() {
            return Err(BrokerError::Config(
                "a Kafka source needs `group.id` in its client config".to_owned(),
            ));
        }
        if topic.is_empty() || dead_letters.is_empty() {
            return Err(BrokerError::Config(
                "a Kafka topic name cannot be empty".to_owned(),
            ));
        }
        let producer = producer(config.clone())?;
        config
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if config.get("auto.offset.reset").is_none() {
            config.set("auto.offset.reset", "earliest");
        }
        let shared = Arc::new(Shared {
            tracker: Mutex::default(),
            settled: Condvar::new(),
            stopping: AtomicBool::new(false),
            finished: Mutex::new(false),
            finishing: Condvar::new(),
            topic: topic.clone(),
            revoke_grace,
        });
        let consumer: BaseConsumer<Context> = config
            .create_with_context(Context {
                shared: shared.clone(),
            })
            .map_err(broken)?;
        consumer.subscribe(&[&topic]).map_err(broken)?;
        let (sender, messages) = mpsc::channel(settings.prefetch);
        let thread = std::thread::Builder::new()
            .name(format!("idem-kafka-{topic}"))
            .spawn({
                let shared = shared.clone();
                move || poll_loop(&consumer, &shared, &settings, &sender)
            })
            .map_err(|e| BrokerError::broker(BROKER, e))?;
        Ok(KafkaSource {
            shared,
            messages,
            producer,
            dead_letters,
            thread: Some(thread),
        })
    }
}

/// The librdkafka thread: polls, forwards, commits; returns once the
/// source is dropped, after a last synchronous commit (dropping the
/// consumer then leaves the group).
fn poll_loop(
    consumer: &BaseConsumer<Context>,
    shared: &Shared,
    settings: &Settings,
    sender: &mpsc::Sender<Polled>,
) {
    let mut held: Option<Polled> = None;
    let mut last_commit = Instant::now();
    while !shared.stopping.load(Ordering::Relaxed) {
        if let Some(polled) = held.take() {
            match sender.try_send(polled) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(polled)) => {
                    held = Some(polled);
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(mpsc::error::TrySendError::Closed(_)) => break,
            }
        } else {
            match consumer.poll(Duration::from_millis(20)) {
                Some(Ok(message)) => {
                    let id = settings.key.extract(&message);
                    let (partition, offset) = (message.partition(), message.offset());
                    let payload = message.payload().unwrap_or_default().to_vec();
                    drop(message);
                    let mut tracker = shared.lock();
                    tracker.assign(partition);
                    let owned = tracker.owned.get_mut(&partition).expect("just assigned");
                    owned.slots.insert(offset, Slot::Waiting);
                    held = Some(Polled {
                        partition,
                        offset,
                        generation: owned.generation,
                        id,
                        payload,
                        count: 1,
                    });
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, topic = %shared.topic, "Kafka consumer error");
                }
                None => {}
            }
        }
        if last_commit.elapsed() >= settings.commit_interval {
            last_commit = Instant::now();
            commit(consumer, shared, CommitMode::Async);
        }
    }
    commit(consumer, shared, CommitMode::Sync);
    *shared.finished.lock().unwrap_or_else(|e| e.into_inner()) = true;
    shared.finishing.notify_all();
}

fn commit(consumer: &BaseConsumer<Context>, shared: &Shared, mode: CommitMode) {
    let commits = std::mem::take(&mut shared.lock().to_commit);
    if let Some(list) = shared.commit_list(commits) {
        if let Err(error) = consumer.commit(&list, mode) {
            tracing::warn!(%error, "an offset commit failed; settled messages after the last commit are read again and replayed");
        }
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.settled.notify_all();
        self.messages.close();
        // The last commit is waited for (one broker round trip, at most
        // 5 s), so what the handlers settled is committed when the drop
        // returns; leaving the group goes on in the thread.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut finished = self
            .shared
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while !*finished && Instant::now() < deadline {
            finished = self
                .shared
                .finishing
                .wait_timeout(finished, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(finished);
        drop(self.thread.take());
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn next(&mut self, wait: Duration) -> Result<Option<Box<dyn Delivery>>, BrokerError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let (due, next_due) = {
                let mut tracker = self.shared.lock();
                let now = Instant::now();
                let due = match tracker.retries.iter().position(|(at, _)| *at <= now) {
                    Some(i) => tracker.retries.remove(i).map(|(_, p)| p),
                    None => None,
                };
                let next_due = tracker.retries.iter().map(|(at, _)| *at).min();
                (due, next_due)
            };
            let polled = match due {
                Some(polled) => Some(polled),
                None => {
                    let mut until = deadline;
                    if let Some(at) = next_due {
                        until = until.min(tokio::time::Instant::from_std(at));
                    }
                    match tokio::time::timeout_at(until, self.messages.recv()).await {
                        Ok(Some(polled)) => Some(polled),
                        Ok(None) => return Ok(None),
                        Err(_) => None,
                    }
                }
            };
            if let Some(polled) = polled {
                if let Some(delivery) = self.hand_out(polled) {
                    return Ok(Some(delivery));
                }
                continue;
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    fn heartbeat(&self) -> Option<Duration> {
        // Kafka takes a partition back in a rebalance, not a message from
        // a live consumer; librdkafka's own thread keeps the membership.
        None
    }
}

impl KafkaSource {
    /// Waits up to `within` until the group has given this consumer at
    /// least one partition; `false` if it has not by then. Joining a group
    /// takes a rebalance (seconds): a caller that must not count it (a
    /// benchmark, a readiness probe) waits here first.
    pub async fn assigned(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if !self.shared.lock().owned.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Marks `polled` as with a handler, unless its partition was revoked
    /// since it was read (the new owner reads it again).
    fn hand_out(&self, polled: Polled) -> Option<Box<dyn Delivery>> {
        let mut tracker = self.shared.lock();
        let owned = tracker.current(polled.partition, polled.generation)?;
        if owned.revoking {
            return None;
        }
        *owned.slots.get_mut(&polled.offset)? = Slot::Handed;
        Some(Box::new(KafkaDelivery {
            shared: self.shared.clone(),
            producer: self.producer.clone(),
            dead_letters: self.dead_letters.clone(),
            polled,
        }))
    }
}

struct KafkaDelivery {
    shared: Arc<Shared>,
    producer: FutureProducer,
    dead_letters: String,
    polled: Polled,
}

impl fmt::Debug for KafkaDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaDelivery")
            .field("locator", &self.locator())
            .field("id", &self.polled.id)
            .field("count", &self.polled.count)
            .finish_non_exhaustive()
    }
}

impl KafkaDelivery {
    fn lost(&self, what: &str) -> BrokerError {
        BrokerError::Protocol {
            broker: BROKER,
            reason: format!(
                "cannot {what} {}: its partition was revoked since it was read",
                self.locator()
            ),
        }
    }

    fn settle(&self, what: &str) -> Result<(), BrokerError> {
        let p = &self.polled;
        let settled = self
            .shared
            .lock()
            .settle(p.partition, p.generation, p.offset);
        self.shared.settled.notify_all();
        if settled {
            Ok(())
        } else {
            Err(self.lost(what))
        }
    }
}

#[async_trait]
impl Delivery for KafkaDelivery {
    fn message_id(&self) -> Option<&str> {
        self.polled.id.as_deref()
    }

    fn payload(&self) -> &[u8] {
        &self.polled.payload
    }

    fn delivery_count(&self) -> u32 {
        self.polled.count
    }

    fn locator(&self) -> String {
        format!(
            "{}/{}/{}",
            self.shared.topic, self.polled.partition, self.polled.offset
        )
    }

    async fn ack(&self) -> Result<(), BrokerError> {
        self.settle("ack")
    }

    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        let p = &self.polled;
        let mut tracker = self.shared.lock();
        let slot = tracker
            .current(p.partition, p.generation)
            .filter(|o| !o.revoking)
            .and_then(|o| o.slots.get_mut(&p.offset));
        let Some(slot) = slot else {
            drop(tracker);
            return Err(self.lost("retry"));
        };
        *slot = Slot::Waiting;
        let mut again = p.clone();
        again.count = again.count.saturating_add(1);
        tracker.retries.push_back((Instant::now() + delay, again));
        drop(tracker);
        self.shared.settled.notify_all();
        Ok(())
    }

    async fn dead_letter(&self, reason: &str) -> Result<(), BrokerError> {
        let p = &self.polled;
        let origin = self.locator();
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: REASON_HEADER,
                value: Some(reason),
            })
            .insert(Header {
                key: ORIGIN_HEADER,
                value: Some(&origin),
            });
        if let Some(id) = &p.id {
            headers = headers.insert(Header {
                key: KEY_HEADER,
                value: Some(id),
            });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.dead_letters)
            .payload(&p.payload)
            .headers(headers);
        if let Some(id) = &p.id {
            record = record.key(id.as_bytes());
        }
        self.producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| broken(e))?;
        self.settle("dead-letter")
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        Ok(())
    }
}
