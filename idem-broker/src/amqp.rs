//! RabbitMQ (AMQP 0-9-1): a queue subscription as a [`Source`].
//!
//! ```no_run
//! use idem_broker::lapin::{Connection, ConnectionProperties};
//! use idem_broker::{amqp::AmqpSource, Consumer, Message};
//! use idem_core::Idempotent;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! let connection = Connection::connect(url, ConnectionProperties::default()).await?;
//! // The queue "orders" exists (a quorum queue counts redeliveries).
//! // Prefetch twice the consumer's concurrency (8 by default).
//! let source = AmqpSource::new(&connection, "orders", 16, Some("orders.dead")).await?;
//! let store = idem_sqlite::SqliteStore::open("idem.db").await?;
//! let consumer = Consumer::new(Idempotent::new(store));
//! let handler = |message: Message| async move {
//!     println!("shipping {}", message.key); // keyed by the message_id property
//!     Ok::<(), idem_broker::HandlerError>(())
//! };
//! consumer.run(source, handler, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```
//!
//! **What RabbitMQ guarantees:** at-least-once delivery with manual acks;
//! what a channel or connection held unacked is requeued when it closes;
//! publisher confirms say a publish was taken. It does not dedupe
//! publishes, and a classic queue does not count redeliveries.
//!
//! **What idem adds:** one handler run per `message_id` over redeliveries
//! and duplicate publishes alike; acks only after the outcome is recorded;
//! delayed retries with backoff through a retry queue, a delivery limit,
//! and a dead-letter queue that keeps the reason.
//!
//! **Failures the tests reproduce** (`tests/brokers`): the ack withheld
//! and the connection closed; duplicate publishes; poison and
//! always-failing messages; consumers killed with SIGKILL mid-handler.
//!
//! # Connecting over TLS
//!
//! [`connect`] takes an `amqps://` URL with the TLS files in its query,
//! named as RabbitMQ's URI spec names them:
//!
//! ```no_run
//! # async fn run() -> Result<(), idem_broker::BrokerError> {
//! let url = "amqps://billing:secret@rabbit.internal:5671/%2f\
//!     ?cacertfile=/etc/idem/ca.pem&certfile=/etc/idem/client.pem&keyfile=/etc/idem/client.key";
//! let properties = idem_broker::lapin::ConnectionProperties::default();
//! let connection = idem_broker::amqp::connect(url, properties).await?;
//! # let _ = connection; Ok(()) }
//! ```
//!
//! Without `cacertfile` the server is checked against Mozilla's roots.
//! lapin's own `Connection::connect` does TLS too (this crate's `tls`
//! feature turns on its rustls), but takes a client certificate only as
//! PKCS#12; [`connect`] reads PEM files, as the other brokers and stores do.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::Channel;

use crate::delivery::{Delivery, Source};
use crate::BrokerError;

const BROKER: &str = "amqp";

/// The header that counts the retries a message went through.
pub const RETRIES_HEADER: &str = "x-idem-retries";
/// The header that carries a dead letter's reason.
pub const REASON_HEADER: &str = "x-idem-dead-letter-reason";

/// The TLS files of an AMQP URL's query, as RabbitMQ's URI spec names
/// them.
const TLS_FILES: crate::tls::Names = crate::tls::Names {
    ca: "cacertfile",
    cert: "certfile",
    key: "keyfile",
};

/// Connects to the RabbitMQ of `url`: `amqp://` in plain TCP, `amqps://`
/// over TLS with the files its query names (see the [module docs](self)).
///
/// `cacertfile=FILE` is the CA to trust instead of Mozilla's roots;
/// `certfile=FILE` and `keyfile=FILE` are a client certificate and its
/// key (PEM), for servers with `fail_if_no_peer_cert`. The files are read
/// before connecting: one missing or not PEM, or TLS files on an
/// `amqp://` URL, is a [`BrokerError::Config`] naming the parameter. A
/// refused certificate fails here, before any consumer exists. No error
/// shows the URL's password.
pub async fn connect(
    url: &str,
    properties: lapin::ConnectionProperties,
) -> Result<lapin::Connection, BrokerError> {
    let split = crate::tls::split(url, &[TLS_FILES.ca, TLS_FILES.cert, TLS_FILES.key]);
    let uri: lapin::uri::AMQPUri = split.url.parse().map_err(|e: String| {
        let e = e.replace(&split.url, &crate::tls::redact(&split.url));
        BrokerError::Config(format!("amqp: the URL is not an AMQP URI: {e}"))
    })?;
    match uri.scheme {
        lapin::uri::AMQPScheme::AMQP => {
            if let Some((name, _)) = split.taken.first() {
                return Err(BrokerError::Config(format!(
                    "amqp: `{name}` names a TLS file, and the URL is amqp:// (plain TCP): use amqps://"
                )));
            }
            lapin::Connection::connect_uri(uri, properties)
                .await
                .map_err(broken)
        }
        lapin::uri::AMQPScheme::AMQPS => tls_connect(uri, &split, properties).await,
    }
}

#[cfg(feature = "tls")]
async fn tls_connect(
    uri: lapin::uri::AMQPUri,
    split: &crate::tls::Split,
    properties: lapin::ConnectionProperties,
) -> Result<lapin::Connection, BrokerError> {
    use lapin::tcp::{RustlsConnector, TcpStream};

    let config = crate::tls::client_config(BROKER, split, TLS_FILES)?;
    let connector = RustlsConnector::from(std::sync::Arc::new(config));
    // lapin runs this on a blocking thread and drives the handshake to
    // its end; the stream must then be non-blocking for its reactor, as
    // lapin's own connect leaves it. Its signature fixes the large error.
    #[allow(clippy::result_large_err)]
    let connect = move |uri: &lapin::uri::AMQPUri| {
        let host = uri.authority.host.as_str();
        let address = (host, uri.authority.port);
        let stream = match uri.query.connection_timeout {
            Some(ms) => TcpStream::connect_timeout(address, Duration::from_millis(ms))?,
            None => TcpStream::connect(address)?,
        };
        let stream = stream.into_rustls(&connector, host)?;
        stream.set_nonblocking(true)?;
        Ok(stream)
    };
    lapin::Connection::connector(uri, Box::new(connect), properties)
        .await
        .map_err(broken)
}

#[cfg(not(feature = "tls"))]
async fn tls_connect(
    _: lapin::uri::AMQPUri,
    _: &crate::tls::Split,
    _: lapin::ConnectionProperties,
) -> Result<lapin::Connection, BrokerError> {
    Err(BrokerError::Config(
        "amqp: the URL is amqps://, and idem-broker was built without its `tls` feature".to_owned(),
    ))
}

/// A RabbitMQ queue subscription handing out deliveries.
///
/// RabbitMQ takes a delivery back only when its channel or connection
/// closes (or after its `consumer_timeout`, 30 minutes by default), so
/// there is no heartbeat. A delivery's count is 1, plus the retries it went
/// through ([`RETRIES_HEADER`]), plus the times RabbitMQ returned it
/// unacked (the `x-delivery-count` header of quorum queues; on a classic
/// queue a redelivered message counts once more).
///
/// Retries: RabbitMQ cannot delay a message in its queue, so a retry
/// publishes a copy (same `message_id`, one more retry) to the retry queue
/// `<queue>.idem-retry` with the delay as its per-message TTL; expired
/// copies dead-letter back into `<queue>`. The publish is confirmed before
/// the original is acked, so a crash between them duplicates the message
/// (idem replays it) and never loses it. Per-message TTLs expire at the
/// head of the queue only, so a long delay holds back shorter ones queued
/// after it.
///
/// Dead letters are published (confirmed) to the dead-letter queue with
/// a [`REASON_HEADER`] header, then acked; without one they are rejected
/// without requeueing (the queue's own dead-letter exchange, if any, takes
/// them).
pub struct AmqpSource {
    channel: Channel,
    consumer: lapin::Consumer,
    queue: String,
    retry_queue: String,
    dead_letters: Option<String>,
}

impl fmt::Debug for AmqpSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSource")
            .field("queue", &self.queue)
            .field("dead_letters", &self.dead_letters)
            .finish_non_exhaustive()
    }
}

fn broken(e: lapin::Error) -> BrokerError {
    BrokerError::broker(BROKER, e)
}

impl AmqpSource {
    /// Subscribes to `queue` (which the application declared) on a channel
    /// of its own on `connection`, with at most `prefetch` unacked
    /// deliveries at once. Give it at least twice the consumer's
    /// concurrency: with no more than the concurrency, RabbitMQ sends the
    /// next message only when a handler's ack reaches it, so every handler
    /// waits a broker round trip between messages. Measured with a Redis
    /// store at concurrency 16, a prefetch of 16 held the idempotent
    /// consumer to about half the raw consumer's rate and a prefetch of 32
    /// brought it level (`dev/idem-bench/notes/2026-11-30-brokers.md`).
    /// Deliveries held beyond the running handlers are requeued if the
    /// connection closes.
    /// Declares the retry queue `<queue>.idem-retry`, and the dead-letter
    /// queue when one is given.
    pub async fn new(
        connection: &lapin::Connection,
        queue: &str,
        prefetch: u16,
        dead_letters: Option<&str>,
    ) -> Result<AmqpSource, BrokerError> {
        let channel = connection.create_channel().await.map_err(broken)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(broken)?;
        channel
            .basic_qos(prefetch.max(1), BasicQosOptions::default())
            .await
            .map_err(broken)?;
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let retry_queue = format!("{queue}.idem-retry");
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(LongString::from("")),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(LongString::from(queue)),
        );
        channel
            .queue_declare(&retry_queue, durable, arguments)
            .await
            .map_err(broken)?;
        if let Some(dead) = dead_letters {
            channel
                .queue_declare(dead, durable, FieldTable::default())
                .await
                .map_err(broken)?;
        }
        let consumer = channel
            .basic_consume(
                queue,
                "",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(broken)?;
        Ok(AmqpSource {
            channel,
            consumer,
            queue: queue.to_owned(),
            retry_queue,
            dead_letters: dead_letters.map(str::to_owned),
        })
    }
}

/// A header's value as a count, whatever integer type the sender used.
fn count_header(headers: Option<&FieldTable>, name: &str) -> u32 {
    let value = headers.and_then(|h| h.inner().get(name));
    let n: i64 = match value {
        Some(AMQPValue::LongLongInt(n)) => *n,
        Some(AMQPValue::LongInt(n)) => (*n).into(),
        Some(AMQPValue::LongUInt(n)) => (*n).into(),
        Some(AMQPValue::ShortInt(n)) => (*n).into(),
        Some(AMQPValue::ShortUInt(n)) => (*n).into(),
        Some(AMQPValue::ShortShortInt(n)) => (*n).into(),
        Some(AMQPValue::ShortShortUInt(n)) => (*n).into(),
        _ => 0,
    };
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

#[async_trait]
impl Source for AmqpSource {
    async fn next(&mut self, wait: Duration) -> Result<Option<Box<dyn Delivery>>, BrokerError> {
        let delivery = match tokio::time::timeout(wait, self.consumer.next()).await {
            Err(_) => return Ok(None),
            Ok(None) => {
                return Err(BrokerError::Protocol {
                    broker: BROKER,
                    reason: format!("the subscription to {} ended", self.queue),
                })
            }
            Ok(Some(delivery)) => delivery.map_err(broken)?,
        };
        let headers = delivery.properties.headers().as_ref();
        let retries = count_header(headers, RETRIES_HEADER);
        let returned = match headers.and_then(|h| h.inner().get("x-delivery-count")) {
            Some(_) => count_header(headers, "x-delivery-count"),
            None => u32::from(delivery.redelivered),
        };
        let count = 1u32.saturating_add(retries).saturating_add(returned);
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned());
        Ok(Some(Box::new(AmqpDelivery {
            channel: self.channel.clone(),
            delivery,
            id,
            count,
            retries,
            queue: self.queue.clone(),
            retry_queue: self.retry_queue.clone(),
            dead_letters: self.dead_letters.clone(),
        })))
    }

    fn heartbeat(&self) -> Option<Duration> {
        None
    }
}

struct AmqpDelivery {
    channel: Channel,
    delivery: lapin::message::Delivery,
    id: Option<String>,
    count: u32,
    retries: u32,
    queue: String,
    retry_queue: String,
    dead_letters: Option<String>,
}

impl fmt::Debug for AmqpDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDelivery")
            .field("id", &self.id)
            .field("count", &self.count)
            .field("tag", &self.delivery.delivery_tag)
            .finish_non_exhaustive()
    }
}

impl AmqpDelivery {
    /// Publishes a copy of the message with `headers` set, to `queue`
    /// through the default exchange, and waits for the broker's confirm.
    async fn publish_copy(
        &self,
        queue: &str,
        extra: &[(&str, AMQPValue)],
        expiration: Option<Duration>,
    ) -> Result<(), BrokerError> {
        let mut headers = self
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        for (name, value) in extra {
            headers.insert((*name).into(), value.clone());
        }
        let mut properties = self
            .delivery
            .properties
            .clone()
            .with_headers(headers)
            .with_delivery_mode(2);
        if let Some(ttl) = expiration {
            properties = properties.with_expiration(ShortString::from(ttl.as_millis().to_string()));
        }
        let confirm = self
            .channel
            .basic_publish(
                "",
                queue,
                BasicPublishOptions::default(),
                &self.delivery.data,
                properties,
            )
            .await
            .map_err(broken)?
            .await
            .map_err(broken)?;
        match confirm {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(_)) => Err(BrokerError::Protocol {
                broker: BROKER,
                reason: format!("the copy for {queue} was returned unroutable"),
            }),
            Confirmation::Nack(_) => Err(BrokerError::Protocol {
                broker: BROKER,
                reason: format!("the broker refused the copy for {queue}"),
            }),
        }
    }
}

#[async_trait]
impl Delivery for AmqpDelivery {
    fn message_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn payload(&self) -> &[u8] {
        &self.delivery.data
    }

    fn delivery_count(&self) -> u32 {
        self.count
    }

    fn locator(&self) -> String {
        format!("{}#{}", self.queue, self.delivery.delivery_tag)
    }

    async fn ack(&self) -> Result<(), BrokerError> {
        self.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(broken)
    }

    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        let retries = i64::from(self.retries) + 1;
        self.publish_copy(
            &self.retry_queue,
            &[(RETRIES_HEADER, AMQPValue::LongLongInt(retries))],
            // A zero TTL would drop the copy at once; 1 ms dead-letters it back.
            Some(delay.max(Duration::from_millis(1))),
        )
        .await?;
        self.ack().await
    }

    async fn dead_letter(&self, reason: &str) -> Result<(), BrokerError> {
        match &self.dead_letters {
            Some(dead) => {
                self.publish_copy(
                    dead,
                    &[(
                        REASON_HEADER,
                        AMQPValue::LongString(LongString::from(reason)),
                    )],
                    None,
                )
                .await?;
                self.ack().await
            }
            None => self
                .delivery
                .acker
                .reject(BasicRejectOptions { requeue: false })
                .await
                .map_err(broken),
        }
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        Ok(())
    }
}
