//! The receiving end: verify, dedupe, enqueue durably, answer at once.
//!
//! [`Receiver::respond`] holds the whole behaviour over `http` types; the
//! axum router (feature `axum`) and the actix-web service (feature `actix`)
//! are glue around it, so both frameworks answer byte for byte alike.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use idem_http::Problem;

use crate::enqueue::{Enqueue, Shared};
use crate::queue::{Enqueued, JobId, NewJob, QueueError};
use crate::verify::{Verifier, VerifyError};

#[cfg(feature = "actix")]
mod actix;
#[cfg(feature = "axum")]
mod axum;

/// The largest body accepted by default: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Receives one source's webhooks: verifies each delivery over its raw
/// bytes, finds its event id, and enqueues it once per (source, event id)
/// — and, where the signature covers neither the id nor a timestamp
/// ([`Verified::replayable`](crate::verify::Verified::replayable),
/// GitHub), once per (source, body digest) as well, so a captured
/// delivery resent under a new id is a duplicate.
/// The handler never runs inside the request; the provider gets its 2xx as
/// soon as the job is durable.
///
/// The event id comes from the verifier (Standard Webhooks' `webhook-id`,
/// GitHub's `X-GitHub-Delivery`) or, for schemes that carry it in the body,
/// from a JSON pointer into the payload ([`with_event_id_at`]: `/id` for
/// Stripe, `/update_id` for Telegram).
///
/// [`with_event_id_at`]: Receiver::with_event_id_at
#[derive(Clone)]
pub struct Receiver {
    source: String,
    verifier: Arc<dyn Verifier>,
    queue: Arc<dyn Enqueue>,
    pointer: Option<String>,
    max_body: usize,
}

impl fmt::Debug for Receiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("source", &self.source)
            .field("verifier", &self.verifier)
            .field("queue", &self.queue)
            .field("pointer", &self.pointer)
            .field("max_body", &self.max_body)
            .finish()
    }
}

/// What a delivery became.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Received {
    /// A new job.
    Enqueued(JobId),
    /// The event was already queued (or handled); nothing was added.
    Duplicate(JobId),
}

/// Why a delivery was refused. Nothing was enqueued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Rejection {
    /// The delivery failed verification: 401.
    #[error("the webhook failed verification: {0}")]
    Unverified(#[from] VerifyError),
    /// The body is larger than the limit: 413.
    #[error("the body is larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// No event id could be found: 400.
    #[error("no event id: {0}")]
    NoEventId(&'static str),
    /// The queue failed; the provider should resend: 503.
    #[error("the event could not be queued: {0}")]
    Queue(#[from] QueueError),
}

impl Rejection {
    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Unverified(_) => StatusCode::UNAUTHORIZED,
            Rejection::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::NoEventId(_) => StatusCode::BAD_REQUEST,
            Rejection::Queue(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The problem from idem-http's catalogue it answers with. A
    /// verification failure says only that it failed, not why: a forger
    /// learns nothing.
    pub fn to_problem(&self) -> Problem {
        match self {
            Rejection::Unverified(_) => Problem::WebhookUnverified,
            Rejection::TooLarge { limit } => Problem::WebhookTooLarge(*limit),
            Rejection::NoEventId(why) => Problem::WebhookNoEventId(why),
            Rejection::Queue(_) => Problem::InboxUnavailable,
        }
    }

    /// The `application/problem+json` body (RFC 9457), from idem-http's
    /// catalogue.
    pub fn problem(&self) -> serde_json::Value {
        self.to_problem().document()
    }
}

impl Receiver {
    /// A receiver for `source`'s deliveries, checked by `verifier`, queued
    /// on `queue`: any [`Queue`](crate::queue::Queue) (`Arc<SqliteQueue>`,
    /// `Arc<dyn Queue>`, …) or another [`Enqueue`] target, such as a
    /// broker publisher from idem-broker.
    pub fn new<Q: Enqueue + ?Sized>(
        source: impl Into<String>,
        verifier: impl Verifier,
        queue: Arc<Q>,
    ) -> Receiver {
        Receiver {
            source: source.into(),
            verifier: Arc::new(verifier),
            queue: Arc::new(Shared(queue)),
            pointer: None,
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// Reads the event id from the JSON payload at `pointer` (RFC 6901, such
    /// as `/update_id`) when the verifier does not give one. A string is
    /// taken as is; an integer as its decimal form.
    pub fn with_event_id_at(mut self, pointer: impl Into<String>) -> Receiver {
        self.pointer = Some(pointer.into());
        self
    }

    /// The largest body accepted (default 1 MiB).
    pub fn with_max_body(mut self, bytes: usize) -> Receiver {
        self.max_body = bytes;
        self
    }

    /// The source name jobs are enqueued under.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Verifies, dedupes and enqueues one delivery.
    pub async fn receive(&self, headers: &HeaderMap, body: &[u8]) -> Result<Received, Rejection> {
        let received = self.verify_and_enqueue(headers, body).await;
        crate::metrics::received(&self.source, &received);
        received
    }

    async fn verify_and_enqueue(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Received, Rejection> {
        if body.len() > self.max_body {
            return Err(Rejection::TooLarge {
                limit: self.max_body,
            });
        }
        let verified = self.verifier.verify(headers, body)?;
        let event_id = match verified.event_id {
            Some(id) => id,
            None => self.event_id_from_body(body)?,
        };
        let mut job = NewJob::new(&self.source, event_id, body);
        if verified.replayable {
            // The id is not signed: the signed body is what identifies the
            // event, so a resend under a new id is still a duplicate. The id
            // stays the job's key, so events queued by earlier builds, and
            // GitHub's own redeliveries, dedupe as they did.
            job = job.with_dedupe_key(body_key(body));
        }
        match self.queue.enqueue(job).await? {
            Enqueued::New(id) => Ok(Received::Enqueued(id)),
            Enqueued::Duplicate(id) => Ok(Received::Duplicate(id)),
        }
    }

    fn event_id_from_body(&self, body: &[u8]) -> Result<String, Rejection> {
        let pointer = self.pointer.as_deref().ok_or(Rejection::NoEventId(
            "the scheme carries no event id and no payload field is configured",
        ))?;
        let value: serde_json::Value = serde_json::from_slice(body)
            .map_err(|_| Rejection::NoEventId("the payload is not JSON"))?;
        match value.pointer(pointer) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
            _ => Err(Rejection::NoEventId(
                "the payload has no string or integer event id where configured",
            )),
        }
    }

    /// Receives one delivery and builds the answer, framework-free: 202
    /// with `{"status":"enqueued"|"duplicate","job":…}`, or a problem from
    /// idem-http's catalogue. The axum and actix-web glue only move the
    /// headers and bytes in and this response out.
    pub async fn respond(&self, headers: &HeaderMap, body: &[u8]) -> Response<Bytes> {
        match self.receive(headers, body).await {
            Ok(received) => {
                let (status, id) = match &received {
                    Received::Enqueued(id) => ("enqueued", id),
                    Received::Duplicate(id) => ("duplicate", id),
                };
                let json = serde_json::json!({ "status": status, "job": id.as_str() });
                let mut response = Response::new(Bytes::from(json.to_string()));
                *response.status_mut() = StatusCode::ACCEPTED;
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
            }
            Err(rejection) => {
                if let Rejection::Queue(e) = &rejection {
                    tracing::error!(source = %self.source, error = %e, "enqueueing a webhook failed");
                }
                rejection.to_problem().into_response()
            }
        }
    }
}

/// The dedupe key of a signed body: `sha256:` and the hex of its SHA-256.
pub fn body_key(body: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(body)))
}
