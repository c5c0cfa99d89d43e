//! One fixture per broker: a fresh stream, queue or consumer group with a
//! unique name, publishing, the dead letters, what is left unsettled, and
//! the effects handlers made (a Redis hash under a unique prefix).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use idem_broker::enqueue::{AmqpPublisher, JetStreamPublisher, Publish, RedisStreamPublisher};
use idem_broker::{
    amqp::AmqpSource, nats::JetStreamSource, streams::RedisStreamSource, Consumer, Handler, Source,
};
use idem_broker::{async_nats, lapin, redis};
use idem_core::Idempotent;
use idem_testing::{unique_name, Cleanup, Server};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;
use redis::aio::MultiplexedConnection;

/// Which broker a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Nats,
    Amqp,
    Streams,
    #[cfg(feature = "kafka")]
    Kafka,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Nats => "nats",
            Kind::Amqp => "amqp",
            Kind::Streams => "streams",
            #[cfg(feature = "kafka")]
            Kind::Kafka => "kafka",
        }
    }

    pub(crate) fn parse(name: &str) -> Kind {
        match name {
            "nats" => Kind::Nats,
            "amqp" => Kind::Amqp,
            #[cfg(feature = "kafka")]
            "kafka" => Kind::Kafka,
            _ => Kind::Streams,
        }
    }

    fn server(self) -> Server {
        match self {
            Kind::Nats => Server::Nats,
            Kind::Amqp => Server::Amqp,
            Kind::Streams => Server::Redis,
            #[cfg(feature = "kafka")]
            Kind::Kafka => Server::Kafka,
        }
    }
}

/// A broker's fresh names and clients. `redelivery` is how long an
/// unacked delivery stays with its consumer (JetStream's ack wait, the
/// Streams claim idle time; RabbitMQ redelivers when the channel closes).
pub(crate) struct Fixture {
    pub(crate) kind: Kind,
    pub(crate) name: String,
    pub(crate) redelivery: Duration,
    pub(crate) redis: MultiplexedConnection,
    redis_url: String,
    nats: Option<jetstream::Context>,
    amqp: Option<lapin::Connection>,
    amqp_url: String,
    #[cfg(feature = "kafka")]
    kafka: Option<idem_broker::kafka::KafkaPublisher>,
    _cleanup: Vec<Cleanup>,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for cleanup")
}

impl Fixture {
    /// A fresh fixture, or `None` (skip) when a server is unreachable.
    pub(crate) async fn new(kind: Kind, redelivery: Duration) -> Option<Fixture> {
        let name = unique_name(&format!("idem_{}", kind.name()));
        let fixture = Fixture::attach(kind, &name, redelivery, true).await?;
        Some(fixture)
    }

    /// The fixture named `name`, made by another process (`create` false)
    /// or made now.
    pub(crate) async fn attach(
        kind: Kind,
        name: &str,
        redelivery: Duration,
        create: bool,
    ) -> Option<Fixture> {
        let redis_url = Server::Redis.require()?;
        kind.server().require()?;
        let redis = redis::Client::open(redis_url.as_str())
            .unwrap()
            // redis-rs gives up on a reply after 500 ms by default: on a
            // loaded test machine (both cores busy) the effects and call
            // counters this connection reads then fail the test.
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_response_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .unwrap();
        let mut cleanup = Vec::new();
        if create {
            cleanup.push(Cleanup::redis_prefix(&redis_url, name));
        }
        let mut nats = None;
        let mut amqp = None;
        let amqp_url = Server::Amqp.url();
        #[cfg(feature = "kafka")]
        let mut kafka = None;
        match kind {
            Kind::Nats => {
                let client = async_nats::connect(Server::Nats.url()).await.unwrap();
                let context = jetstream::new(client);
                if create {
                    context
                        .create_stream(stream::Config {
                            name: name.to_owned(),
                            subjects: vec![format!("{name}.in")],
                            // Producer retries outlast JetStream's window;
                            // the tests publish duplicates after it.
                            duplicate_window: Duration::from_millis(100),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    context
                        .create_stream(stream::Config {
                            name: format!("{name}_dead"),
                            subjects: vec![format!("{name}.dead")],
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    context
                        .get_stream(name)
                        .await
                        .unwrap()
                        .create_consumer(pull::Config {
                            durable_name: Some("idem".to_owned()),
                            ack_policy: jetstream::consumer::AckPolicy::Explicit,
                            ack_wait: redelivery,
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    let (url, name) = (Server::Nats.url(), name.to_owned());
                    cleanup.push(Cleanup::new(format!("delete streams {name}"), move || {
                        runtime().block_on(async {
                            let context = jetstream::new(async_nats::connect(url).await?);
                            context.delete_stream(&name).await?;
                            context.delete_stream(format!("{name}_dead")).await?;
                            Ok(())
                        })
                    }));
                }
                nats = Some(context);
            }
            Kind::Amqp => {
                let connection =
                    lapin::Connection::connect(&amqp_url, lapin::ConnectionProperties::default())
                        .await
                        .unwrap();
                if create {
                    let channel = connection.create_channel().await.unwrap();
                    let mut arguments = FieldTable::default();
                    arguments.insert(
                        "x-queue-type".into(),
                        AMQPValue::LongString(LongString::from("quorum")),
                    );
                    channel
                        .queue_declare(
                            name,
                            QueueDeclareOptions {
                                durable: true,
                                ..Default::default()
                            },
                            arguments,
                        )
                        .await
                        .unwrap();
                    let (url, name) = (amqp_url.clone(), name.to_owned());
                    cleanup.push(Cleanup::new(format!("delete queues {name}"), move || {
                        runtime().block_on(async {
                            let connection = lapin::Connection::connect(
                                &url,
                                lapin::ConnectionProperties::default(),
                            )
                            .await?;
                            let channel = connection.create_channel().await?;
                            for queue in [
                                name.clone(),
                                format!("{name}.idem-retry"),
                                format!("{name}.dead"),
                            ] {
                                channel
                                    .queue_delete(&queue, QueueDeleteOptions::default())
                                    .await?;
                            }
                            connection.close(200, "done").await?;
                            Ok(())
                        })
                    }));
                }
                amqp = Some(connection);
            }
            Kind::Streams => {}
            #[cfg(feature = "kafka")]
            Kind::Kafka => {
                if create {
                    crate::kafka::create_topics(name).await;
                    let name = name.to_owned();
                    cleanup.push(Cleanup::new(format!("delete topics {name}"), move || {
                        runtime().block_on(crate::kafka::delete_topics(&name))
                    }));
                }
                kafka = Some(crate::kafka::publisher(name));
            }
        }
        Some(Fixture {
            kind,
            name: name.to_owned(),
            redelivery,
            redis,
            redis_url,
            nats,
            amqp,
            amqp_url,
            #[cfg(feature = "kafka")]
            kafka,
            _cleanup: cleanup,
        })
    }

    /// Publishes `payload` under message id `id`.
    pub(crate) async fn publish(&self, id: &str, payload: &[u8]) {
        match self.kind {
            Kind::Nats => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
                self.nats
                    .as_ref()
                    .unwrap()
                    .publish_with_headers(
                        format!("{}.in", self.name),
                        headers,
                        payload.to_vec().into(),
                    )
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            Kind::Amqp => {
                let channel = self.amqp.as_ref().unwrap().create_channel().await.unwrap();
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .unwrap();
                channel
                    .basic_publish(
                        "",
                        &self.name,
                        BasicPublishOptions::default(),
                        payload,
                        BasicProperties::default()
                            .with_message_id(id.into())
                            .with_delivery_mode(2),
                    )
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                channel.close(200, "published").await.unwrap();
            }
            Kind::Streams => {
                idem_broker::streams::publish(
                    &mut self.redis.clone(),
                    &self.stream_key(),
                    id,
                    payload,
                )
                .await
                .unwrap();
            }
            #[cfg(feature = "kafka")]
            Kind::Kafka => {
                self.kafka
                    .as_ref()
                    .unwrap()
                    .send(id, payload)
                    .await
                    .unwrap();
            }
        }
    }

    /// A publisher to this fixture's stream, queue or subject.
    pub(crate) async fn publisher(&self) -> Box<dyn Publish> {
        match self.kind {
            Kind::Nats => Box::new(JetStreamPublisher::new(
                self.nats.clone().unwrap(),
                format!("{}.in", self.name),
            )),
            Kind::Amqp => Box::new(
                AmqpPublisher::new(self.amqp.as_ref().unwrap(), "", &self.name)
                    .await
                    .unwrap(),
            ),
            Kind::Streams => Box::new(
                RedisStreamPublisher::new(
                    &redis::Client::open(self.redis_url.as_str()).unwrap(),
                    &self.stream_key(),
                )
                .await
                .unwrap(),
            ),
            #[cfg(feature = "kafka")]
            Kind::Kafka => Box::new(crate::kafka::publisher(&self.name)),
        }
    }

    /// How many messages were published to the broker. JetStream (limits
    /// retention) and Streams keep acked messages; a RabbitMQ queue counts
    /// its ready ones only, so call this before anything consumes.
    pub(crate) async fn published(&self) -> u64 {
        match self.kind {
            Kind::Nats => {
                let mut stream = self
                    .nats
                    .as_ref()
                    .unwrap()
                    .get_stream(&self.name)
                    .await
                    .unwrap();
                stream.info().await.unwrap().state.messages
            }
            Kind::Amqp => {
                let channel = self.amqp.as_ref().unwrap().create_channel().await.unwrap();
                let queue = channel
                    .queue_declare(
                        &self.name,
                        QueueDeclareOptions {
                            passive: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let _ = channel.close(200, "counted").await;
                u64::from(queue.message_count())
            }
            Kind::Streams => redis::cmd("XLEN")
                .arg(self.stream_key())
                .query_async(&mut self.redis.clone())
                .await
                .unwrap(),
            #[cfg(feature = "kafka")]
            Kind::Kafka => crate::kafka::published(&self.name),
        }
    }

    fn stream_key(&self) -> String {
        format!("{}:stream", self.name)
    }

    /// A source reading as consumer `consumer`.
    pub(crate) async fn source(&self, consumer: &str) -> Box<dyn Source> {
        match self.kind {
            Kind::Nats => Box::new(
                JetStreamSource::new(self.nats.clone().unwrap(), &self.name, "idem")
                    .await
                    .unwrap()
                    .with_dead_letter_subject(format!("{}.dead", self.name))
                    .with_batch(4),
            ),
            Kind::Amqp => {
                // Its own connection: closing it hands its deliveries back.
                let connection = lapin::Connection::connect(
                    &self.amqp_url,
                    lapin::ConnectionProperties::default(),
                )
                .await
                .unwrap();
                let source = AmqpSource::new(
                    &connection,
                    &self.name,
                    4,
                    Some(&format!("{}.dead", self.name)),
                )
                .await
                .unwrap();
                Box::new(OwnedAmqp {
                    source,
                    connection: Some(connection),
                })
            }
            Kind::Streams => Box::new(
                RedisStreamSource::new(
                    &redis::Client::open(self.redis_url.as_str()).unwrap(),
                    &self.stream_key(),
                    "idem",
                    consumer,
                )
                .await
                .unwrap()
                .with_claim_idle(self.redelivery)
                .with_dead_letter_stream(format!("{}:dead", self.name))
                .with_batch(4),
            ),
            #[cfg(feature = "kafka")]
            Kind::Kafka => Box::new(crate::kafka::source(&self.name)),
        }
    }

    /// The dead letters: (message id, reason).
    pub(crate) async fn dead_letters(&self) -> Vec<(String, String)> {
        match self.kind {
            Kind::Nats => {
                let context = self.nats.as_ref().unwrap();
                let mut stream = context
                    .get_stream(format!("{}_dead", self.name))
                    .await
                    .unwrap();
                let count = stream.info().await.unwrap().state.messages;
                let mut out = Vec::new();
                for sequence in 1..=count {
                    let message = stream.get_raw_message(sequence).await.unwrap();
                    let header = |name: &str| {
                        message
                            .headers
                            .get(name)
                            .map(|v| v.as_str().to_owned())
                            .unwrap_or_default()
                    };
                    out.push((
                        header(idem_broker::nats::ID_HEADER),
                        header(idem_broker::nats::REASON_HEADER),
                    ));
                }
                out
            }
            Kind::Amqp => {
                let channel = self.amqp.as_ref().unwrap().create_channel().await.unwrap();
                let mut out = Vec::new();
                while let Some(message) = channel
                    .basic_get(
                        &format!("{}.dead", self.name),
                        BasicGetOptions { no_ack: true },
                    )
                    .await
                    .unwrap()
                {
                    let id = message
                        .delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|s| s.as_str().to_owned())
                        .unwrap_or_default();
                    let reason = message
                        .delivery
                        .properties
                        .headers()
                        .as_ref()
                        .and_then(|h| h.inner().get(idem_broker::amqp::REASON_HEADER).cloned())
                        .map(|v| match v {
                            AMQPValue::LongString(s) => {
                                String::from_utf8_lossy(s.as_bytes()).into_owned()
                            }
                            other => format!("{other:?}"),
                        })
                        .unwrap_or_default();
                    out.push((id, reason));
                }
                channel.close(200, "read").await.unwrap();
                out
            }
            Kind::Streams => {
                let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                    .arg(format!("{}:dead", self.name))
                    .arg("-")
                    .arg("+")
                    .query_async(&mut self.redis.clone())
                    .await
                    .unwrap();
                entries
                    .ids
                    .iter()
                    .map(|e| {
                        let text = |f: &str| e.get::<String>(f).unwrap_or_default();
                        (text("id"), text("reason"))
                    })
                    .collect()
            }
            #[cfg(feature = "kafka")]
            Kind::Kafka => crate::kafka::dead_letters(&self.name),
        }
    }

    /// Messages the broker still holds for the consumer: not yet
    /// delivered, delivered and unacked, or waiting for a retry.
    pub(crate) async fn unsettled(&self) -> u64 {
        match self.kind {
            Kind::Nats => {
                let stream = self
                    .nats
                    .as_ref()
                    .unwrap()
                    .get_stream(&self.name)
                    .await
                    .unwrap();
                let info = stream.consumer_info("idem").await.unwrap();
                info.num_pending + info.num_ack_pending as u64
            }
            Kind::Amqp => {
                // Ready messages only: deliveries held by a live channel
                // are not counted, so call this with no consumer running.
                let channel = self.amqp.as_ref().unwrap().create_channel().await.unwrap();
                let mut total = 0;
                for queue in [self.name.clone(), format!("{}.idem-retry", self.name)] {
                    let declared = channel
                        .queue_declare(
                            &queue,
                            QueueDeclareOptions {
                                passive: true,
                                ..Default::default()
                            },
                            FieldTable::default(),
                        )
                        .await;
                    if let Ok(queue) = declared {
                        total += u64::from(queue.message_count());
                    }
                }
                let _ = channel.close(200, "counted").await;
                total
            }
            Kind::Streams => {
                let groups: Vec<std::collections::HashMap<String, redis::Value>> =
                    redis::cmd("XINFO")
                        .arg("GROUPS")
                        .arg(self.stream_key())
                        .query_async(&mut self.redis.clone())
                        .await
                        .unwrap();
                let group = groups.into_iter().next().expect("the consumer group");
                let number = |name: &str| match group.get(name) {
                    Some(redis::Value::Int(n)) => *n as u64,
                    _ => 0,
                };
                number("pending") + number("lag")
            }
            #[cfg(feature = "kafka")]
            Kind::Kafka => crate::kafka::unsettled(&self.name),
        }
    }

    /// The idem store every consumer of this fixture shares: Redis, under
    /// this fixture's prefix.
    pub(crate) async fn idem(&self, lease: Duration) -> Idempotent {
        let store = idem_redis::RedisStore::connect(self.redis_url.as_str())
            .await
            .unwrap()
            .with_prefix(format!("{}:idem:", self.name));
        Idempotent::new(store).with_lease(lease)
    }

    fn effects_key(&self) -> String {
        format!("{}:effects", self.name)
    }

    /// A handler that adds one effect for its message's key (not deduped:
    /// a second run shows as 2).
    pub(crate) fn effect_handler(&self) -> impl Handler + Clone {
        let (connection, key) = (self.redis.clone(), self.effects_key());
        move |message: idem_broker::Message| {
            let (mut connection, key) = (connection.clone(), key.clone());
            async move {
                redis::cmd("HINCRBY")
                    .arg(&key)
                    .arg(&message.key)
                    .arg(1)
                    .query_async::<i64>(&mut connection)
                    .await
                    .map_err(idem_broker::HandlerError::retryable)?;
                Ok(())
            }
        }
    }

    /// Adds one effect for `key` (what [`effect_handler`] does).
    pub(crate) async fn add_effect(&self, key: &str) {
        redis::cmd("HINCRBY")
            .arg(self.effects_key())
            .arg(key)
            .arg(1)
            .query_async::<i64>(&mut self.redis.clone())
            .await
            .unwrap();
    }

    /// Effects made, per key.
    pub(crate) async fn effects(&self) -> BTreeMap<String, u64> {
        redis::cmd("HGETALL")
            .arg(self.effects_key())
            .query_async(&mut self.redis.clone())
            .await
            .unwrap()
    }

    /// Runs `consumer` with `handler` on fresh sources until every message
    /// is settled and `done` holds, or `limit` passes (then panics).
    pub(crate) async fn drain<H: Handler + Clone>(
        &self,
        consumer: &Consumer,
        handler: H,
        limit: Duration,
        done: impl Fn(&BTreeMap<String, u64>) -> bool + Send + Sync,
    ) {
        let deadline = Instant::now() + limit;
        loop {
            let source = self.source(&unique_name("drain")).await;
            let stop = Arc::new(tokio::sync::Notify::new());
            let run = {
                let (consumer, handler, stop) = (consumer.clone(), handler.clone(), stop.clone());
                tokio::spawn(async move {
                    consumer
                        .run(source, handler, async move { stop.notified().await })
                        .await
                })
            };
            // RabbitMQ's count leaves out held deliveries, so its check
            // runs between consumer runs; the others are checked live.
            let slice = if self.kind == Kind::Amqp {
                Duration::from_millis(600)
            } else {
                limit
            };
            let slice_end = Instant::now() + slice;
            let mut finished = false;
            while Instant::now() < slice_end.min(deadline) {
                if self.kind != Kind::Amqp
                    && done(&self.effects().await)
                    && self.unsettled().await == 0
                {
                    finished = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            stop.notify_one();
            run.await.unwrap().unwrap();
            if self.kind == Kind::Amqp {
                // The stopped consumer's connection closes in the
                // background, and RabbitMQ hands the deliveries it still
                // held back to the queue only then: count after that, or a
                // prefetched duplicate shows up after the drain returned.
                tokio::time::sleep(Duration::from_millis(500)).await;
                finished = done(&self.effects().await) && self.unsettled().await == 0;
            }
            if finished {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{:?}: not drained within {limit:?}: effects {:?}, unsettled {}",
                self.kind,
                self.effects().await,
                self.unsettled().await
            );
        }
    }
}

/// An AMQP source that owns its connection, so dropping it closes the
/// connection and RabbitMQ takes back whatever it held.
#[derive(Debug)]
struct OwnedAmqp {
    source: AmqpSource,
    connection: Option<lapin::Connection>,
}

#[async_trait::async_trait]
impl Source for OwnedAmqp {
    async fn next(
        &mut self,
        wait: Duration,
    ) -> Result<Option<Box<dyn idem_broker::Delivery>>, idem_broker::BrokerError> {
        self.source.next(wait).await
    }

    fn heartbeat(&self) -> Option<Duration> {
        self.source.heartbeat()
    }
}

impl Drop for OwnedAmqp {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            tokio::spawn(async move {
                let _ = connection.close(200, "consumer done").await;
            });
        }
    }
}
