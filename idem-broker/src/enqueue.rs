//! The brokers as the webhook inbox's queue: an [`Enqueuer`] publishes each
//! verified event once per (source, event id), and a
//! [`Consumer`](crate::Consumer) handles it once.
//!
//! idem-inbox's [`Receiver`](idem_inbox::Receiver) enqueues through
//! [`idem_inbox::Enqueue`]. An [`Enqueuer`] is one: it runs the confirmed
//! publish under idem's `execute`, keyed by the event, so a provider's
//! resend within the retention (three days at least) replays "enqueued"
//! and publishes nothing. The message goes out with [`message_id`] as its
//! id (JetStream's `Nats-Msg-Id`, the AMQP `message_id`, the entry's `id`
//! field), which is what the [`Consumer`](crate::Consumer) keys the
//! handler by.
//!
//! NATS JetStream (the stream `WEBHOOKS` captures `webhooks.in`):
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_broker::async_nats::{self, jetstream};
//! use idem_broker::enqueue::{Enqueuer, JetStreamPublisher};
//! use idem_core::Idempotent;
//! use idem_inbox::{verify::StandardWebhooks, Receiver};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! let idem = Idempotent::new(idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?);
//! let enqueuer = Enqueuer::new(JetStreamPublisher::new(js, "webhooks.in"), idem);
//! let verifier = StandardWebhooks::new(["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"])?;
//! let receiver = Receiver::new("acme", verifier, Arc::new(enqueuer));
//! let app = axum::Router::new().nest("/webhooks/acme", receiver.router());
//! // Serve `app`; consume with JetStreamSource and a Consumer keyed by message id.
//! # let _ = app; Ok(())
//! # }
//! ```
//!
//! RabbitMQ (through the default exchange to the queue `webhooks`):
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_broker::enqueue::{AmqpPublisher, Enqueuer};
//! use idem_broker::lapin::{Connection, ConnectionProperties};
//! use idem_core::Idempotent;
//! use idem_inbox::{verify::Stripe, Receiver};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! let connection = Connection::connect(url, ConnectionProperties::default()).await?;
//! let publisher = AmqpPublisher::new(&connection, "", "webhooks").await?;
//! let idem = Idempotent::new(idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?);
//! let receiver = Receiver::new("stripe", Stripe::new(["whsec_stripe"])?, Arc::new(Enqueuer::new(publisher, idem)))
//!     .with_event_id_at("/id"); // Stripe carries the event id in the body
//! let app = axum::Router::new().nest("/webhooks/stripe", receiver.router());
//! // Serve `app`; consume with AmqpSource and a Consumer keyed by message id.
//! # let _ = app; Ok(())
//! # }
//! ```
//!
//! Redis Streams (entries with the fields `id` and `payload` on `webhooks`):
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_broker::enqueue::{Enqueuer, RedisStreamPublisher};
//! use idem_broker::redis;
//! use idem_core::Idempotent;
//! use idem_inbox::{verify::GitHub, Receiver};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let publisher = RedisStreamPublisher::new(&client, "webhooks").await?;
//! let idem = Idempotent::new(idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?);
//! let receiver = Receiver::new("github", GitHub::new(["It's a Secret to Everybody"])?, Arc::new(Enqueuer::new(publisher, idem)));
//! let app = axum::Router::new().nest("/webhooks/github", receiver.router());
//! // Serve `app`; consume with RedisStreamSource and a Consumer keyed by message id.
//! # let _ = app; Ok(())
//! # }
//! ```
//!
//! # What is guaranteed, and where
//!
//! * **A 2xx means the broker has the message**: the publish is confirmed
//!   (JetStream's publish acknowledgement, a RabbitMQ publisher confirm of
//!   a mandatory publish, the `XADD` reply) before "enqueued" is recorded
//!   and answered. A failed publish releases the event's key and answers
//!   503, so the provider resends.
//! * **A resend publishes nothing**: the record of the publish is kept for
//!   the idem handle's retention, raised to at least three days
//!   ([`DEFAULT_RETENTION`]) — JetStream's own duplicate window is two
//!   minutes, and RabbitMQ and Streams have none. A resend racing the first
//!   delivery waits for its outcome (up to five seconds,
//!   [`with_wait`](Enqueuer::with_wait)) and answers "duplicate", or 503 if
//!   the first is still publishing then.
//! * **A crash between the publish and its record** (or a confirm lost on
//!   the way back) publishes the event again on the provider's next resend,
//!   once idem's lease on the first attempt lapses. The consumer's own
//!   `execute` is keyed by the same message id, so the handler still runs
//!   once; the broker holds the message twice (JetStream drops the second
//!   within its duplicate window).
//! * The records of published events are kept in the idem handle's
//!   namespace under the scope [`SCOPE`], apart from the consumer's
//!   records of handled messages, so one store (and one handle) can serve
//!   both.
//!
//! # Why not an idem-inbox `Queue`
//!
//! A `Queue` is also claimed, settled and inspected by the inbox's
//! `Worker`, and none of these brokers can honour that part of the
//! contract: a settle reports `LeaseLost` when another worker claimed the
//! job since (JetStream's and RabbitMQ's acks answer nothing), a lease has
//! the caller's length (JetStream's is the consumer's fixed ack wait;
//! RabbitMQ holds a delivery until its channel closes), and a job can be
//! inspected and requeued by id (a RabbitMQ queue cannot be read at an id).
//! The consumer of this crate is the broker's worker instead: it keeps the
//! delivery alive, retries with backoff through the broker and parks dead
//! letters, while idem fences the handler.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Error as IdemError, Idempotent, Key};
use idem_inbox::queue::{Enqueued, JobId, NewJob, QueueError, DEFAULT_RETENTION};
use sha2::{Digest, Sha256};

use crate::BrokerError;

/// The scope, within the idem handle's namespace, of the records of
/// published events.
pub const SCOPE: &str = "idem-broker:enqueued";

/// How long a resend that meets a publish in progress waits for its
/// outcome, by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

/// Publishes one message to a broker and waits until the broker confirms
/// it holds it.
#[async_trait]
pub trait Publish: Send + Sync + fmt::Debug + 'static {
    /// The broker's name, for errors: `"nats"`, `"amqp"`, `"redis-streams"`.
    fn broker(&self) -> &'static str;

    /// Publishes `payload` under message id `id`; returns once the broker
    /// confirmed it, with the broker's name for the message (a stream
    /// sequence, an entry id) for logs.
    async fn publish(&self, id: &str, payload: &[u8]) -> Result<String, BrokerError>;
}

#[async_trait]
impl<P: Publish + ?Sized> Publish for Box<P> {
    fn broker(&self) -> &'static str {
        (**self).broker()
    }

    async fn publish(&self, id: &str, payload: &[u8]) -> Result<String, BrokerError> {
        (**self).publish(id, payload).await
    }
}

#[async_trait]
impl<P: Publish + ?Sized> Publish for std::sync::Arc<P> {
    fn broker(&self) -> &'static str {
        (**self).broker()
    }

    async fn publish(&self, id: &str, payload: &[u8]) -> Result<String, BrokerError> {
        (**self).publish(id, payload).await
    }
}

/// The message id an event from `source` with id `event_id` is published
/// under, and the consumer keys its handler by: `source:event_id` when
/// that is a valid idem key and `source` holds no `:` (so the pair reads
/// back unambiguously), else `sha256:` and the hex digest of the
/// length-prefixed pair.
pub fn message_id(source: &str, event_id: &str) -> String {
    let readable = format!("{source}:{event_id}");
    if !source.is_empty()
        && !source.contains(':')
        && source != "sha256"
        && Key::validate_client_key(&readable).is_ok()
    {
        return readable;
    }
    let mut digest = Sha256::new();
    digest.update((source.len() as u64).to_be_bytes());
    digest.update(source.as_bytes());
    digest.update(event_id.as_bytes());
    format!("sha256:{}", hex::encode(digest.finalize()))
}

/// Enqueues verified events on a broker, once per (source, event id): an
/// [`idem_inbox::Enqueue`] for idem-inbox's receiver. See the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct Enqueuer<P> {
    publisher: P,
    idem: Idempotent,
}

impl<P: Publish> Enqueuer<P> {
    /// Publishes with `publisher`, recording each published event through
    /// `idem` (its store and namespace; the scope becomes [`SCOPE`], the
    /// retention at least [`DEFAULT_RETENTION`], and a resend that meets a
    /// publish in progress waits [`DEFAULT_WAIT`] for it).
    pub fn new(publisher: P, idem: Idempotent) -> Enqueuer<P> {
        let retention = idem.retention().max(DEFAULT_RETENTION);
        let idem = idem
            .scoped(SCOPE)
            .with_retention(retention)
            .with_wait(DEFAULT_WAIT);
        Enqueuer { publisher, idem }
    }

    /// How long a resend that meets a publish in progress waits for its
    /// outcome before it fails (and the receiver answers 503).
    pub fn with_wait(mut self, wait: Duration) -> Enqueuer<P> {
        self.idem = self.idem.with_wait(wait);
        self
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }
}

#[async_trait]
impl<P: Publish> idem_inbox::Enqueue for Enqueuer<P> {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued, QueueError> {
        if !job.delay.is_zero() {
            return Err(QueueError::Backend {
                backend: self.publisher.broker(),
                source: Box::new(BrokerError::Config(
                    "a published message cannot be delayed; enqueue it with no delay".to_owned(),
                )),
            });
        }
        let id = message_id(&job.source, &job.event_id);
        let ran = AtomicBool::new(false);
        // The request is the event alone (the key says which): a resend
        // whose body differs is still the same event, a duplicate.
        let published: Result<String, IdemError<BrokerError>> = self
            .idem
            .execute(&id, &(), || async {
                ran.store(true, Ordering::Relaxed);
                self.publisher.publish(&id, &job.payload).await
            })
            .await;
        match published {
            Ok(locator) if ran.load(Ordering::Relaxed) => {
                tracing::debug!(%id, %locator, "event published");
                Ok(Enqueued::New(JobId::new(id)))
            }
            Ok(locator) => {
                tracing::debug!(%id, %locator, "event already published");
                Ok(Enqueued::Duplicate(JobId::new(id)))
            }
            Err(IdemError::Work(error)) => Err(QueueError::Backend {
                backend: self.publisher.broker(),
                source: Box::new(error),
            }),
            Err(error) => Err(QueueError::Backend {
                backend: "idem",
                source: Box::new(error),
            }),
        }
    }
}

#[cfg(feature = "nats")]
mod nats {
    use async_nats::jetstream;

    use super::*;

    /// Publishes to a JetStream subject with `Nats-Msg-Id`, waiting for the
    /// stream's acknowledgement.
    #[derive(Debug, Clone)]
    pub struct JetStreamPublisher {
        context: jetstream::Context,
        subject: String,
    }

    impl JetStreamPublisher {
        /// Publishes to `subject`, which a stream must capture (or every
        /// publish fails: JetStream acknowledges nothing else).
        pub fn new(context: jetstream::Context, subject: impl Into<String>) -> JetStreamPublisher {
            JetStreamPublisher {
                context,
                subject: subject.into(),
            }
        }
    }

    #[async_trait]
    impl Publish for JetStreamPublisher {
        fn broker(&self) -> &'static str {
            "nats"
        }

        async fn publish(&self, id: &str, payload: &[u8]) -> Result<String, BrokerError> {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
            let ack = self
                .context
                .publish_with_headers(
                    self.subject.clone(),
                    headers,
                    bytes::Bytes::copy_from_slice(payload),
                )
                .await
                .map_err(|e| BrokerError::broker("nats", e))?
                .await
                .map_err(|e| BrokerError::broker("nats", e))?;
            Ok(format!("{}#{}", ack.stream, ack.sequence))
        }
    }
}
#[cfg(feature = "nats")]
pub use nats::JetStreamPublisher;

#[cfg(feature = "amqp")]
mod amqp {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
    use lapin::publisher_confirm::Confirmation;
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, Channel, ExchangeKind};

    use super::*;

    fn broken(e: lapin::Error) -> BrokerError {
        BrokerError::broker("amqp", e)
    }

    /// Publishes persistent, mandatory messages with a `message_id` to a
    /// RabbitMQ exchange, waiting for the publisher confirm.
    #[derive(Debug, Clone)]
    pub struct AmqpPublisher {
        channel: Channel,
        exchange: String,
        routing_key: String,
    }

    impl AmqpPublisher {
        /// Publishes to `exchange` with `routing_key` (the default
        /// exchange `""` and a queue's name send straight to that queue),
        /// on a channel of its own on `connection`, in confirm mode. A
        /// named exchange must exist: it is checked here. A message no
        /// queue takes is returned by RabbitMQ and its publish fails.
        pub async fn new(
            connection: &lapin::Connection,
            exchange: &str,
            routing_key: &str,
        ) -> Result<AmqpPublisher, BrokerError> {
            let channel = connection.create_channel().await.map_err(broken)?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(broken)?;
            if !exchange.is_empty() {
                channel
                    .exchange_declare(
                        exchange,
                        ExchangeKind::Direct,
                        ExchangeDeclareOptions {
                            passive: true,
                            ..ExchangeDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .map_err(broken)?;
            }
            Ok(AmqpPublisher {
                channel,
                exchange: exchange.to_owned(),
                routing_key: routing_key.to_owned(),
            })
        }
    }

    #[async_trait]
    impl Publish for AmqpPublisher {
        fn broker(&self) -> &'static str {
            "amqp"
        }

        async fn publish(&self, id: &str, payload: &[u8]) -> Result<String, BrokerError> {
            let confirm = self
                .channel
                .basic_publish(
                    &self.exchange,
                    &self.routing_key,
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    payload,
                    BasicProperties::default()
                        .with_message_id(id.into())
                        .with_delivery_mode(2),
                )
                .await
                .map_err(broken)?
                .await
                .map_err(broken)?;
            match confirm {
                Confirmation::Ack(None) => Ok(format!("{}/{}", self.exchange, self.routing_key)),
                Confirmation::Ack(Some(_)) => Err(BrokerError::Protocol {
                    broker: "amqp",
                    reason: format!(
                        "no queue takes messages sent to exchange {:?} with routing key {:?}",
                        self.exchange, self.routing_key
                    ),
                }),
                Confirmation::Nack(_) => Err(BrokerError::Protocol {
                    broker: "amqp",
                    reason: "the broker refused the message".to_owned(),
                }),
                Confirmation::NotRequested => Err(BrokerError::Protocol {
                    broker: "amqp",
                    reason: "the channel is not in confirm mode".to_owned(),
                }),
            }
        }
    }
}
#[cfg(feature = "amqp")]
pub use amqp::AmqpPublisher;

#[cfg(feature = "redis-streams")]
mod streams {
    use redis::aio::MultiplexedConnection;

    use super::*;

    /// Adds entries to a Redis stream with `XADD`, in the form
    /// [`RedisStreamSource`](crate::streams::RedisStreamSource) reads.
    #[derive(Debug, Clone)]
    pub struct RedisStreamPublisher {
        connection: MultiplexedConnection,
        stream: String,
    }

    impl RedisStreamPublisher {
        /// Adds to `stream`, over a connection of its own from `client`.
        pub async fn new(
            client: &redis::Client,
            stream: &str,
        ) -> Result<RedisStreamPublisher, BrokerError> {
            let connection = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| BrokerError::broker("redis-streams", e))?;
            Ok(RedisStreamPublisher {
                connection,
                stream: stream.to_owned(),
            })
        }
    }

    #[async_trait]
    impl Publish for RedisStreamPublisher {
        fn broker(&self) -> &'static str {
            "redis-streams"
        }

        async fn publish(&self, id: &str, payload: &[u8]) -> Result<String, BrokerError> {
            let mut connection = self.connection.clone();
            let entry = crate::streams::publish(&mut connection, &self.stream, id, payload).await?;
            Ok(format!("{}#{entry}", self.stream))
        }
    }
}
#[cfg(feature = "redis-streams")]
pub use streams::RedisStreamPublisher;
