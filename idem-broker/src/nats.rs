//! NATS JetStream: a pull consumer as a [`Source`].
//!
//! ```no_run
//! use idem_broker::async_nats::{self, jetstream};
//! use idem_broker::{nats::JetStreamSource, Consumer, Message};
//! use idem_core::Idempotent;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! // The stream "ORDERS" and its durable pull consumer "billing" (explicit
//! // ack) exist; a stream captures "orders.dead" for the dead letters.
//! let source = JetStreamSource::new(js, "ORDERS", "billing")
//!     .await?
//!     .with_dead_letter_subject("orders.dead");
//! let store = idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let consumer = Consumer::new(Idempotent::new(store));
//! let handler = |message: Message| async move {
//!     println!("charging {}", message.key); // keyed by Nats-Msg-Id
//!     Ok::<(), idem_broker::HandlerError>(())
//! };
//! consumer.run(source, handler, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```
//!
//! **What JetStream guarantees:** at-least-once delivery to a durable
//! consumer; a message not acked within the ack wait is redelivered;
//! `Nats-Msg-Id` drops duplicate publishes within the stream's duplicate
//! window (two minutes by default). It also accepts an ack from whoever
//! holds a delivery's reply subject, so a consumer that stalled past the
//! ack wait can ack the message while another consumer is still working on
//! its redelivery.
//!
//! **What idem adds:** the handler runs once per message id for as long
//! as idem retains the outcome (days, not minutes); the ack is sent only
//! after the outcome is recorded, so a crash before it means a redelivery
//! that replays; a consumer that lost its idem lease while it stalled
//! sends no ack at all; long handlers keep their delivery with `+WPI`.
//!
//! **Failures the tests reproduce** (`tests/brokers`): the ack withheld
//! until the ack wait lapses; a consumer stalled past the ack wait whose
//! late ack would settle the other consumer's redelivery; duplicate
//! publishes after the duplicate window; poison and always-failing
//! messages; consumers killed with SIGKILL mid-handler.
//!
//! # Connecting over TLS
//!
//! [`connect`] takes a NATS URL with the TLS files in its query, named as
//! the `nats` command's flags name them:
//!
//! ```no_run
//! # async fn run() -> Result<(), idem_broker::BrokerError> {
//! let url = "tls://billing:secret@nats.internal:4222\
//!     ?tlsca=/etc/idem/ca.pem&tlscert=/etc/idem/client.pem&tlskey=/etc/idem/client.key";
//! let js = idem_broker::async_nats::jetstream::new(idem_broker::nats::connect(url).await?);
//! # let _ = js; Ok(()) }
//! ```
//!
//! `tls://` (or `nats://…?tls=true`) refuses a server that does not
//! offer TLS; plain `nats://` still upgrades when the server requires it.
//! Without `tlsca` the server is checked against Mozilla's roots.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::{self, Message};
use async_nats::HeaderMap;
use async_trait::async_trait;
use futures_util::StreamExt;

use crate::delivery::{Delivery, Source};
use crate::BrokerError;

const BROKER: &str = "nats";

/// The header that carries a dead letter's reason.
pub const REASON_HEADER: &str = "Idem-Dead-Letter-Reason";
/// The header that carries a dead letter's message id. Not `Nats-Msg-Id`:
/// the dead-letter stream would drop a second dead letter of the same id
/// within its duplicate window.
pub const ID_HEADER: &str = "Idem-Message-Id";

/// The TLS files of a NATS URL's query.
const TLS_FILES: crate::tls::Names = crate::tls::Names {
    ca: "tlsca",
    cert: "tlscert",
    key: "tlskey",
};
/// The query parameter that makes TLS required on a `nats://` URL.
const TLS_REQUIRED: &str = "tls";

/// Connects to the NATS server(s) of `url` (comma-separated for several),
/// with the TLS files its query names (see the [module docs](self)).
///
/// The query's `tlsca=FILE` is the CA to trust instead of Mozilla's
/// roots; `tlscert=FILE` and `tlskey=FILE` are a client certificate and
/// its key, for servers that `verify` clients; `tls=true` refuses a server
/// that does not offer TLS, as `tls://` does. The files are read before
/// connecting: one missing or not PEM is a [`BrokerError::Config`] naming
/// the parameter. A server that cannot be reached, or whose certificate is
/// refused, fails here, before any consumer exists; no error shows the
/// URL's password. Everything else is async-nats's defaults: use
/// [`connect_with_options`] to change them.
pub async fn connect(url: &str) -> Result<async_nats::Client, BrokerError> {
    connect_with_options(url, async_nats::ConnectOptions::new()).await
}

/// As [`connect`], on top of `options` (credentials, names, timeouts).
pub async fn connect_with_options(
    url: &str,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, BrokerError> {
    let split = crate::tls::split(
        url,
        &[TLS_FILES.ca, TLS_FILES.cert, TLS_FILES.key, TLS_REQUIRED],
    );
    let required = match split.value(TLS_REQUIRED) {
        None | Some("false" | "0") => false,
        Some("true" | "1") => true,
        Some(other) => {
            return Err(BrokerError::Config(format!(
                "nats: `{TLS_REQUIRED}={other}` is neither true nor false"
            )))
        }
    };
    let config = crate::tls::client_config(BROKER, &split, TLS_FILES)?;
    options
        .require_tls(required)
        .tls_client_config(config)
        .connect(split.url.as_str())
        .await
        .map_err(|e| BrokerError::broker(BROKER, e))
}

/// A JetStream pull consumer handing out deliveries.
///
/// The consumer (durable, explicit ack) is made by the application; this
/// source reads its ack wait and keeps each running delivery alive with an
/// in-progress ack (`+WPI`) every third of it. Retries are negative acks
/// with the backoff as the redelivery delay. Dead letters are published,
/// with the original message id in [`ID_HEADER`] and the reason in
/// [`REASON_HEADER`], to the
/// dead-letter subject (which a stream must capture: the publish waits for
/// JetStream's acknowledgement), and then the delivery is terminated
/// (`+TERM`); without a dead-letter subject it is only terminated.
///
/// A consumer that stops while a pull is waiting leaves that pull open on
/// the server until it expires (after the consumer's poll interval, at
/// least 100 ms): messages published meanwhile are handed to it, and come
/// back to the next consumer only after the ack wait. Nothing is lost,
/// but they are late by that much.
pub struct JetStreamSource {
    context: jetstream::Context,
    consumer: PullConsumer,
    ack_wait: Duration,
    batch: usize,
    dead_letters: Option<String>,
    buffer: VecDeque<Message>,
}

impl fmt::Debug for JetStreamSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamSource")
            .field("consumer", &self.consumer.cached_info().name)
            .field("ack_wait", &self.ack_wait)
            .field("batch", &self.batch)
            .field("dead_letters", &self.dead_letters)
            .finish_non_exhaustive()
    }
}

impl JetStreamSource {
    /// Reads deliveries from the durable pull consumer `consumer` of
    /// `stream`.
    pub async fn new(
        context: jetstream::Context,
        stream: &str,
        consumer: &str,
    ) -> Result<JetStreamSource, BrokerError> {
        let consumer: PullConsumer = context
            .get_consumer_from_stream(consumer, stream)
            .await
            .map_err(|e| BrokerError::broker(BROKER, e))?;
        let ack_wait = consumer.cached_info().config.ack_wait;
        Ok(JetStreamSource {
            context,
            consumer,
            ack_wait,
            batch: 16,
            dead_letters: None,
            buffer: VecDeque::new(),
        })
    }

    /// Publishes dead letters to `subject` (default: none, only `+TERM`).
    pub fn with_dead_letter_subject(mut self, subject: impl Into<String>) -> JetStreamSource {
        self.dead_letters = Some(subject.into());
        self
    }

    /// Pulls up to `n` messages per request (default 16). Pulled messages
    /// wait for a free handler with their ack wait running, so keep it
    /// near the consumer's concurrency.
    pub fn with_batch(mut self, n: usize) -> JetStreamSource {
        self.batch = n.max(1);
        self
    }
}

#[async_trait]
impl Source for JetStreamSource {
    async fn next(&mut self, wait: Duration) -> Result<Option<Box<dyn Delivery>>, BrokerError> {
        if self.buffer.is_empty() {
            let mut batch = self
                .consumer
                .batch()
                .max_messages(self.batch)
                .expires(wait.max(Duration::from_millis(100)))
                .messages()
                .await
                .map_err(|e| BrokerError::broker(BROKER, e))?;
            while let Some(message) = batch.next().await {
                self.buffer
                    .push_back(message.map_err(|e| BrokerError::broker(BROKER, e))?);
            }
        }
        let Some(message) = self.buffer.pop_front() else {
            return Ok(None);
        };
        let (count, locator) = {
            let info = message.info().map_err(|e| BrokerError::Protocol {
                broker: BROKER,
                reason: format!("a message without JetStream metadata: {e}"),
            })?;
            (
                u32::try_from(info.delivered).unwrap_or(u32::MAX).max(1),
                format!("{}#{}", info.stream, info.stream_sequence),
            )
        };
        let id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned());
        Ok(Some(Box::new(JetStreamDelivery {
            message,
            id,
            count,
            locator,
            context: self.context.clone(),
            dead_letters: self.dead_letters.clone(),
        })))
    }

    fn heartbeat(&self) -> Option<Duration> {
        Some(self.ack_wait / 3)
    }
}

struct JetStreamDelivery {
    message: Message,
    id: Option<String>,
    count: u32,
    locator: String,
    context: jetstream::Context,
    dead_letters: Option<String>,
}

impl fmt::Debug for JetStreamDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamDelivery")
            .field("id", &self.id)
            .field("count", &self.count)
            .field("locator", &self.locator)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Delivery for JetStreamDelivery {
    fn message_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    fn delivery_count(&self) -> u32 {
        self.count
    }

    fn locator(&self) -> String {
        self.locator.clone()
    }

    async fn ack(&self) -> Result<(), BrokerError> {
        // A confirmed ack: the server has taken it when this returns.
        self.message
            .double_ack()
            .await
            .map_err(|e| BrokerError::broker(BROKER, e))
    }

    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        self.message
            .ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(|e| BrokerError::broker(BROKER, e))
    }

    async fn dead_letter(&self, reason: &str) -> Result<(), BrokerError> {
        if let Some(subject) = &self.dead_letters {
            let mut headers = HeaderMap::new();
            if let Some(id) = &self.id {
                headers.insert(ID_HEADER, id.as_str());
            }
            headers.insert(REASON_HEADER, reason);
            self.context
                .publish_with_headers(subject.clone(), headers, self.message.payload.clone())
                .await
                .map_err(|e| BrokerError::broker(BROKER, e))?
                .await
                .map_err(|e| BrokerError::broker(BROKER, e))?;
        } else {
            tracing::warn!(locator = %self.locator, reason, "terminating a message without a dead-letter subject");
        }
        self.message
            .ack_with(AckKind::Term)
            .await
            .map_err(|e| BrokerError::broker(BROKER, e))
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        self.message
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| BrokerError::broker(BROKER, e))
    }
}
