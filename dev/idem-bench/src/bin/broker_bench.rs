//! Messages per second through idem-broker's idempotent consumer against a
//! raw consumer of the same broker doing the same work and acking, in the
//! same run, and the idem store operations each message costs.
//!
//! `cargo run --release -p idem-bench --bin broker-bench -- --help`
//!
//! For each broker (NATS JetStream, RabbitMQ, Redis Streams, Kafka) and idem store
//! (Redis, SQLite), every repetition publishes the messages on fresh names
//! and consumes them twice over, alternating: a raw consumer (take, work,
//! ack) and idem's consumer (take, claim, work, record, ack), both through
//! the same source and client code, at the same concurrency. The work is
//! one Redis `INCR` per message. The idem run is then repeated on the same
//! message ids (redeliveries and duplicate publishes), which replay. Each
//! figure is the median over repetitions; store operations are counted by
//! a wrapper around the store (one operation is one round trip for both
//! stores). The raw run goes first in even repetitions and last in odd
//! ones. `--steps` adds where a message's time goes: mean milliseconds in
//! the store, the work and the ack, against the cycle (concurrency over
//! throughput); what the cycle holds beyond them is waiting for deliveries
//! and for a turn on the runtime.
//!
//! Kafka's messages carry 1 KiB payloads (`--kafka-payload`), the others
//! `{}`; its consumers join a group before the clock starts, and every
//! run reads a topic of one partition through the same `KafkaSource`
//! (the raw run acks through it too, so offsets are committed the same
//! way).
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Parser;
use idem_broker::async_nats::jetstream::{self, consumer::pull, stream};
use idem_broker::kafka::{KafkaPublisher, KafkaSource};
use idem_broker::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use idem_broker::lapin::types::FieldTable;
use idem_broker::lapin::{self, BasicProperties};
use idem_broker::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem_broker::rdkafka::client::DefaultClientContext;
use idem_broker::rdkafka::ClientConfig;
use idem_broker::redis;
use idem_broker::{
    amqp::AmqpSource, nats::JetStreamSource, streams::RedisStreamSource, Consumer, ConsumerConfig,
    Delivery, Message, Source,
};
use idem_core::store::{Insert, NewRecord, Record, Store, StoreError, Token};
use idem_core::Idempotent;
use idem_testing::Server;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Benchmarks the idempotent consumer against a raw one on each broker.
#[derive(Debug, Parser)]
#[command(name = "broker-bench")]
struct Args {
    /// A short run for CI: 200 messages, 3 repetitions.
    #[arg(long)]
    quick: bool,
    /// Messages per run.
    #[arg(long, default_value_t = 2000)]
    messages: u64,
    /// Repetitions; figures are medians.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Handlers at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Deliveries the broker hands out ahead of the handlers: RabbitMQ's
    /// prefetch, the JetStream and Streams batch (default: twice the
    /// concurrency).
    #[arg(long)]
    prefetch: Option<usize>,
    /// Also print where each message's time goes: mean milliseconds in the
    /// idem store, the work and the ack, and the cycle (concurrency over
    /// throughput).
    #[arg(long)]
    steps: bool,
    /// Brokers, comma-separated: nats, amqp, streams, kafka.
    #[arg(long, value_delimiter = ',', default_value = "nats,amqp,streams,kafka")]
    brokers: Vec<String>,
    /// idem stores, comma-separated: redis, sqlite.
    #[arg(long, value_delimiter = ',', default_value = "redis,sqlite")]
    stores: Vec<String>,
    /// Redis (the work, the Streams broker and the Redis store).
    #[arg(long, env = Server::Redis.env_var(), default_value = Server::Redis.default_url())]
    redis_url: String,
    /// NATS with JetStream.
    #[arg(long, env = Server::Nats.env_var(), default_value = Server::Nats.default_url())]
    nats_url: String,
    /// RabbitMQ.
    #[arg(
        long,
        env = Server::Amqp.env_var(),
        default_value = Server::Amqp.default_url()
    )]
    amqp_url: String,
    /// A Kafka-protocol broker (`host:port`).
    #[arg(long, env = Server::Kafka.env_var(), default_value = Server::Kafka.default_url())]
    kafka_url: String,
    /// Bytes of each Kafka message's payload.
    #[arg(long, default_value_t = 1024)]
    kafka_payload: usize,
    /// Rewrite the brokers table in this Markdown file between its
    /// markers: `--markdown BENCHMARKS.md`.
    #[arg(long, value_name = "FILE")]
    markdown: Option<std::path::PathBuf>,
}

/// A store that counts the operations it passes on.
#[derive(Debug)]
struct Counting<S> {
    inner: S,
    ops: Arc<AtomicU64>,
}

#[async_trait]
impl<S: Store> Store for Counting<S> {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let result = self.inner.insert(key, record).await;
        Steps::add(&STEPS.store, began);
        result
    }
    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let result = self.inner.swap(key, expected, record).await;
        Steps::add(&STEPS.store, began);
        result
    }
    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let result = self.inner.take_over(key, expected, record).await;
        Steps::add(&STEPS.store, began);
        result
    }
    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let result = self.inner.remove(key, expected).await;
        Steps::add(&STEPS.store, began);
        result
    }
    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let result = self.inner.load(key).await;
        Steps::add(&STEPS.store, began);
        result
    }
    async fn reset(&self, key: &str) -> Result<idem_core::store::Reset, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let result = self.inner.reset(key).await;
        Steps::add(&STEPS.store, began);
        result
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.inner.purge_expired(limit).await
    }
}

/// Time spent per step, summed over a run's messages.
#[derive(Debug, Default)]
struct Steps {
    store: AtomicU64,
    work: AtomicU64,
    ack: AtomicU64,
}

impl Steps {
    fn add(counter: &AtomicU64, since: Instant) {
        let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Mean milliseconds per message of each step, and resets them.
    fn take(&self, messages: u64) -> [f64; 3] {
        let per = |counter: &AtomicU64| {
            counter.swap(0, Ordering::Relaxed) as f64 / 1e6 / messages.max(1) as f64
        };
        [per(&self.store), per(&self.work), per(&self.ack)]
    }
}

static STEPS: Steps = Steps {
    store: AtomicU64::new(0),
    work: AtomicU64::new(0),
    ack: AtomicU64::new(0),
};

/// A source whose deliveries time their acks into [`STEPS`].
#[derive(Debug)]
struct Timed(Box<dyn Source>);

#[async_trait]
impl Source for Timed {
    async fn next(
        &mut self,
        wait: Duration,
    ) -> Result<Option<Box<dyn Delivery>>, idem_broker::BrokerError> {
        Ok(self
            .0
            .next(wait)
            .await?
            .map(|d| Box::new(TimedDelivery(d)) as Box<dyn Delivery>))
    }

    fn heartbeat(&self) -> Option<Duration> {
        self.0.heartbeat()
    }
}

#[derive(Debug)]
struct TimedDelivery(Box<dyn Delivery>);

#[async_trait]
impl Delivery for TimedDelivery {
    fn message_id(&self) -> Option<&str> {
        self.0.message_id()
    }
    fn payload(&self) -> &[u8] {
        self.0.payload()
    }
    fn delivery_count(&self) -> u32 {
        self.0.delivery_count()
    }
    fn locator(&self) -> String {
        self.0.locator()
    }
    async fn ack(&self) -> Result<(), idem_broker::BrokerError> {
        let began = Instant::now();
        let acked = self.0.ack().await;
        Steps::add(&STEPS.ack, began);
        acked
    }
    async fn retry(&self, delay: Duration) -> Result<(), idem_broker::BrokerError> {
        self.0.retry(delay).await
    }
    async fn dead_letter(&self, reason: &str) -> Result<(), idem_broker::BrokerError> {
        self.0.dead_letter(reason).await
    }
    async fn in_progress(&self) -> Result<(), idem_broker::BrokerError> {
        self.0.in_progress().await
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broker {
    Nats,
    Amqp,
    Streams,
    Kafka,
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Broker::Nats => "nats",
            Broker::Amqp => "amqp",
            Broker::Streams => "streams",
            Broker::Kafka => "kafka",
        })
    }
}

/// One broker's fresh names for one run.
struct Lane<'a> {
    args: &'a Args,
    broker: Broker,
    name: String,
    nats: Option<jetstream::Context>,
    amqp: Option<lapin::Connection>,
    kafka: Option<KafkaPublisher>,
    redis: redis::aio::MultiplexedConnection,
}

impl<'a> Lane<'a> {
    async fn new(args: &'a Args, broker: Broker) -> Result<Lane<'a>, BoxError> {
        let name = format!("idem_bench_{broker}_{:08x}", rand::random::<u32>());
        let redis = redis::Client::open(args.redis_url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let mut lane = Lane {
            args,
            broker,
            name,
            nats: None,
            amqp: None,
            kafka: None,
            redis,
        };
        match broker {
            Broker::Nats => {
                let context =
                    jetstream::new(idem_broker::async_nats::connect(&args.nats_url).await?);
                context
                    .create_stream(stream::Config {
                        name: lane.name.clone(),
                        subjects: vec![format!("{}.in", lane.name)],
                        duplicate_window: Duration::from_millis(100),
                        ..Default::default()
                    })
                    .await?;
                context
                    .get_stream(&lane.name)
                    .await?
                    .create_consumer(pull::Config {
                        durable_name: Some("idem".to_owned()),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: Duration::from_secs(30),
                        ..Default::default()
                    })
                    .await?;
                lane.nats = Some(context);
            }
            Broker::Amqp => {
                let connection = lapin::Connection::connect(
                    &args.amqp_url,
                    lapin::ConnectionProperties::default(),
                )
                .await?;
                let channel = connection.create_channel().await?;
                channel
                    .queue_declare(
                        &lane.name,
                        QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                lane.amqp = Some(connection);
            }
            Broker::Streams => {}
            Broker::Kafka => {
                let admin: AdminClient<DefaultClientContext> = lane.kafka_config().create()?;
                let topic = NewTopic::new(&lane.name, 1, TopicReplication::Fixed(1));
                for created in admin.create_topics([&topic], &AdminOptions::new()).await? {
                    created.map_err(|(topic, code)| format!("creating {topic}: {code}"))?;
                }
                lane.kafka = Some(KafkaPublisher::new(lane.kafka_config(), &lane.name)?);
            }
        }
        Ok(lane)
    }

    async fn publish_all(&self) -> Result<(), BoxError> {
        let messages = self.args.messages;
        match self.broker {
            Broker::Nats => {
                let context = self.nats.as_ref().ok_or("no nats")?;
                let mut acks = Vec::new();
                for n in 0..messages {
                    let mut headers = idem_broker::async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", format!("m-{n}").as_str());
                    acks.push(
                        context
                            .publish_with_headers(format!("{}.in", self.name), headers, "{}".into())
                            .await?,
                    );
                }
                for ack in acks {
                    ack.await?;
                }
            }
            Broker::Amqp => {
                let channel = self
                    .amqp
                    .as_ref()
                    .ok_or("no amqp")?
                    .create_channel()
                    .await?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await?;
                let mut confirms = Vec::new();
                for n in 0..messages {
                    confirms.push(
                        channel
                            .basic_publish(
                                "",
                                &self.name,
                                BasicPublishOptions::default(),
                                b"{}",
                                BasicProperties::default()
                                    .with_message_id(format!("m-{n}").into())
                                    .with_delivery_mode(2),
                            )
                            .await?,
                    );
                }
                for confirm in confirms {
                    confirm.await?;
                }
                channel.close(200, "published").await?;
            }
            Broker::Streams => {
                let mut pipe = redis::pipe();
                for n in 0..messages {
                    pipe.cmd("XADD")
                        .arg(self.stream_key())
                        .arg("*")
                        .arg("id")
                        .arg(format!("m-{n}"))
                        .arg("payload")
                        .arg("{}")
                        .ignore();
                }
                pipe.query_async::<()>(&mut self.redis.clone()).await?;
            }
            Broker::Kafka => {
                let publisher = self.kafka.as_ref().ok_or("no kafka")?;
                let payload = vec![b'x'; self.args.kafka_payload];
                let sends = (0..messages).map(|n| {
                    let payload = &payload;
                    async move { publisher.send(&format!("m-{n}"), payload).await }
                });
                for sent in futures_util::future::join_all(sends).await {
                    sent?;
                }
            }
        }
        Ok(())
    }

    fn kafka_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.args.kafka_url);
        config
    }

    fn stream_key(&self) -> String {
        format!("{}:stream", self.name)
    }

    async fn source(&self) -> Result<(Box<dyn Source>, Option<lapin::Connection>), BoxError> {
        let (source, connection) = self.untimed_source().await?;
        Ok((Box::new(Timed(source)), connection))
    }

    async fn untimed_source(
        &self,
    ) -> Result<(Box<dyn Source>, Option<lapin::Connection>), BoxError> {
        let batch = self
            .args
            .prefetch
            .unwrap_or(2 * self.args.concurrency)
            .max(1);
        Ok(match self.broker {
            Broker::Nats => (
                Box::new(
                    JetStreamSource::new(self.nats.clone().ok_or("no nats")?, &self.name, "idem")
                        .await?
                        .with_batch(batch),
                ),
                None,
            ),
            Broker::Amqp => {
                let connection = lapin::Connection::connect(
                    &self.args.amqp_url,
                    lapin::ConnectionProperties::default(),
                )
                .await?;
                let prefetch = u16::try_from(batch).unwrap_or(u16::MAX);
                let source = AmqpSource::new(&connection, &self.name, prefetch, None).await?;
                (Box::new(source), Some(connection))
            }
            Broker::Streams => (
                Box::new(
                    RedisStreamSource::new(
                        &redis::Client::open(self.args.redis_url.as_str())?,
                        &self.stream_key(),
                        "idem",
                        "bench",
                    )
                    .await?
                    .with_batch(batch),
                ),
                None,
            ),
            Broker::Kafka => {
                let mut config = self.kafka_config();
                config.set("group.id", format!("{}-group", self.name));
                let source = KafkaSource::builder(config, &self.name)
                    .with_prefetch(batch)
                    .start()?;
                // The group's rebalance is not part of the rate.
                if !source.assigned(Duration::from_secs(30)).await {
                    return Err("the Kafka group assigned no partition in 30 s".into());
                }
                (Box::new(source), None)
            }
        })
    }

    async fn cleanup(self) -> Result<(), BoxError> {
        match self.broker {
            Broker::Nats => {
                self.nats
                    .as_ref()
                    .ok_or("no nats")?
                    .delete_stream(&self.name)
                    .await?;
            }
            Broker::Amqp => {
                let connection = self.amqp.ok_or("no amqp")?;
                let channel = connection.create_channel().await?;
                for queue in [self.name.clone(), format!("{}.idem-retry", self.name)] {
                    channel
                        .queue_delete(&queue, QueueDeleteOptions::default())
                        .await?;
                }
                connection.close(200, "done").await?;
            }
            Broker::Streams => {}
            Broker::Kafka => {
                let admin: AdminClient<DefaultClientContext> = self.kafka_config().create()?;
                admin
                    .delete_topics(&[&self.name], &AdminOptions::new())
                    .await?;
            }
        }
        let mut redis = self.redis.clone();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.name))
            .query_async(&mut redis)
            .await?;
        if !keys.is_empty() {
            redis::cmd("DEL")
                .arg(keys)
                .query_async::<()>(&mut redis)
                .await?;
        }
        Ok(())
    }

    /// The work both consumers do: one Redis INCR.
    #[allow(clippy::type_complexity)]
    fn work(
        &self,
    ) -> impl Fn() -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), redis::RedisError>> + Send>,
    > + Clone
           + Send
           + Sync
           + 'static {
        let (connection, key) = (self.redis.clone(), format!("{}:work", self.name));
        move || {
            let (mut connection, key) = (connection.clone(), key.clone());
            Box::pin(async move {
                let began = Instant::now();
                let done = redis::cmd("INCR")
                    .arg(&key)
                    .query_async::<()>(&mut connection)
                    .await;
                Steps::add(&STEPS.work, began);
                done
            })
        }
    }

    /// Take, work, ack: the raw consumer. Returns messages/s.
    async fn raw(&self) -> Result<f64, BoxError> {
        let (mut source, _connection) = self.source().await?;
        let work = self.work();
        let done = Arc::new(AtomicU64::new(0));
        let slots = Arc::new(Semaphore::new(self.args.concurrency));
        let mut running = JoinSet::new();
        let began = Instant::now();
        // The same stop as the idem run's: polled every millisecond, and
        // it ends a wait for a delivery at once (the last messages are not
        // followed by a poll's full wait).
        let target = self.args.messages;
        let stop = {
            let done = done.clone();
            async move {
                while done.load(Ordering::Relaxed) < target {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        };
        tokio::pin!(stop);
        loop {
            let slot = tokio::select! {
                biased;
                () = &mut stop => break,
                slot = slots.clone().acquire_owned() => slot?,
            };
            let next = tokio::select! {
                biased;
                () = &mut stop => break,
                next = source.next(Duration::from_millis(100)) => next?,
            };
            if let Some(delivery) = next {
                let (work, done) = (work.clone(), done.clone());
                running.spawn(async move {
                    let _slot = slot;
                    if work().await.is_ok() && delivery.ack().await.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            while running.try_join_next().is_some() {}
        }
        while running.join_next().await.is_some() {}
        let rate = self.args.messages as f64 / began.elapsed().as_secs_f64();
        settle_pulls().await;
        Ok(rate)
    }

    /// idem's consumer on `idem`. Returns messages/s.
    async fn idem(&self, idem: Idempotent) -> Result<f64, BoxError> {
        let (source, _connection) = self.source().await?;
        let work = self.work();
        let consumer = Consumer::new(idem).with_config(
            ConsumerConfig::default()
                .with_concurrency(self.args.concurrency)
                .with_poll(Duration::from_millis(100)),
        );
        let handler = move |_: Message| {
            let work = work.clone();
            async move { work().await.map_err(idem_broker::HandlerError::retryable) }
        };
        let watcher = consumer.clone();
        let target = self.args.messages;
        let began = Instant::now();
        consumer
            .run(source, handler, async move {
                loop {
                    let settled = watcher.stats().of(idem_broker::Outcome::Handled)
                        + watcher.stats().of(idem_broker::Outcome::Replayed);
                    if settled >= target {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await?;
        let rate = self.args.messages as f64 / began.elapsed().as_secs_f64();
        settle_pulls().await;
        Ok(rate)
    }
}

/// Waits out a JetStream pull left open by a stopped run (it expires
/// after the 100 ms poll): messages published for the next run while it
/// is open go to it and come back only after the 30 s ack wait.
async fn settle_pulls() {
    tokio::time::sleep(Duration::from_millis(250)).await;
}

async fn store(
    args: &Args,
    name: &str,
    ops: Arc<AtomicU64>,
) -> Result<(Idempotent, Option<tempfile::TempDir>), BoxError> {
    match name {
        "redis" => {
            let inner = idem_redis::RedisStore::connect(args.redis_url.as_str())
                .await?
                .with_prefix(format!("idem_bench_store_{:08x}:", rand::random::<u32>()));
            Ok((Idempotent::new(Counting { inner, ops }), None))
        }
        "sqlite" => {
            let dir = tempfile::tempdir()?;
            let inner = idem_sqlite::SqliteStore::open(dir.path().join("idem.db")).await?;
            Ok((Idempotent::new(Counting { inner, ops }), Some(dir)))
        }
        other => Err(format!("unknown store {other}").into()),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let mut args = Args::parse();
    if args.quick {
        args.messages = 200;
        args.reps = 3;
    }
    println!(
        "{:<8} {:<7} {:>10} {:>10} {:>6} {:>11} {:>9} {:>11}",
        "broker",
        "store",
        "raw msg/s",
        "idem msg/s",
        "ratio",
        "replay msg/s",
        "ops/first",
        "ops/replay"
    );
    let mut table = idem_bench::markdown::Table::new(&[
        "broker",
        "idem store",
        ">raw msg/s",
        ">idem msg/s",
        ">idem ÷ raw",
        ">replays msg/s",
        ">store ops per message",
    ]);
    for broker in &args.brokers {
        let broker = match broker.as_str() {
            "nats" => Broker::Nats,
            "amqp" => Broker::Amqp,
            "streams" => Broker::Streams,
            "kafka" => Broker::Kafka,
            other => return Err(format!("unknown broker {other}").into()),
        };
        for store_name in &args.stores {
            let (mut raw, mut first, mut replay, mut ops_first, mut ops_replay) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let (mut raw_steps, mut idem_steps) = (Vec::new(), Vec::new());
            for rep in 0..args.reps {
                let lane = match Lane::new(&args, broker).await {
                    Ok(lane) => lane,
                    Err(e) if std::env::var_os("CI").is_none() => {
                        println!("{broker:<8} skipped: {e}");
                        break;
                    }
                    Err(e) => return Err(e),
                };
                // The raw run goes first in even repetitions and last in
                // odd ones, so neither side always meets a warmer broker.
                if rep % 2 == 0 {
                    lane.publish_all().await?;
                    raw.push(lane.raw().await?);
                    raw_steps.push(STEPS.take(args.messages));
                }
                let ops = Arc::new(AtomicU64::new(0));
                let (idem, _dir) = store(&args, store_name, ops.clone()).await?;
                lane.publish_all().await?;
                STEPS.take(args.messages);
                first.push(lane.idem(idem.clone()).await?);
                idem_steps.push(STEPS.take(args.messages));
                ops_first.push(ops.swap(0, Ordering::Relaxed) as f64 / args.messages as f64);
                lane.publish_all().await?;
                replay.push(lane.idem(idem).await?);
                ops_replay.push(ops.swap(0, Ordering::Relaxed) as f64 / args.messages as f64);
                if rep % 2 == 1 {
                    lane.publish_all().await?;
                    STEPS.take(args.messages);
                    raw.push(lane.raw().await?);
                    raw_steps.push(STEPS.take(args.messages));
                }
                lane.cleanup().await?;
            }
            if raw.is_empty() {
                continue;
            }
            let (raw, first) = (median(raw), median(first));
            let (replay, ops_first, ops_replay) =
                (median(replay), median(ops_first), median(ops_replay));
            if args.steps {
                for (name, steps, rate) in [("raw", &raw_steps, raw), ("idem", &idem_steps, first)]
                {
                    let step = |i: usize| median(steps.iter().map(|s| s[i]).collect());
                    println!(
                        "steps {broker} {store_name} {name}: store {:.3} ms, work {:.3} ms, ack {:.3} ms, cycle {:.3} ms",
                        step(0),
                        step(1),
                        step(2),
                        args.concurrency as f64 * 1e3 / rate
                    );
                }
            }
            println!(
                "{:<8} {:<7} {:>10.0} {:>10.0} {:>6.2} {:>11.0} {:>9.2} {:>11.2}",
                broker.to_string(),
                store_name,
                raw,
                first,
                first / raw,
                replay,
                ops_first,
                ops_replay
            );
            println!("ratio broker {broker} {store_name} {:.3}", first / raw);
            table.row(vec![
                broker.to_string(),
                store_name.clone(),
                format!("{raw:.0}"),
                format!("{first:.0}"),
                format!("{:.2}", first / raw),
                format!("{replay:.0}"),
                format!("{ops_first:.2}"),
            ]);
        }
    }
    if let Some(path) = &args.markdown {
        idem_bench::markdown::rewrite(path, &[("brokers", table.render())])?;
    }
    Ok(())
}
