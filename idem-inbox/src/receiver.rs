//! The receiving end: verify, dedupe, enqueue durably, answer at once.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, StatusCode};

use crate::queue::{Enqueued, JobId, NewJob, Queue, QueueError};
use crate::verify::{Verifier, VerifyError};

/// The largest body accepted by default: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Receives one source's webhooks: verifies each delivery over its raw
/// bytes, finds its event id, and enqueues it once per (source, event id).
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
    queue: Arc<dyn Queue>,
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

    /// The `application/problem+json` body (RFC 9457). A verification
    /// failure says only that it failed, not why: a forger learns nothing.
    pub fn problem(&self) -> serde_json::Value {
        let (slug, title, detail) = match self {
            Rejection::Unverified(_) => (
                "webhook-unverified",
                "Webhook signature invalid",
                "the delivery could not be verified and was not accepted".to_owned(),
            ),
            Rejection::TooLarge { limit } => (
                "webhook-too-large",
                "Webhook body too large",
                format!("the body is larger than {limit} bytes"),
            ),
            Rejection::NoEventId(why) => (
                "webhook-no-event-id",
                "Webhook event id missing",
                (*why).to_owned(),
            ),
            Rejection::Queue(_) => (
                "inbox-unavailable",
                "Inbox unavailable",
                "the event could not be stored; it is safe to resend".to_owned(),
            ),
        };
        serde_json::json!({
            "type": format!("tag:idem-rs.github.io,2025:problem/{slug}"),
            "title": title,
            "status": self.status().as_u16(),
            "detail": detail,
        })
    }
}

impl Receiver {
    /// A receiver for `source`'s deliveries, checked by `verifier`, queued
    /// on `queue`.
    pub fn new(
        source: impl Into<String>,
        verifier: impl Verifier,
        queue: Arc<dyn Queue>,
    ) -> Receiver {
        Receiver {
            source: source.into(),
            verifier: Arc::new(verifier),
            queue,
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
        match self
            .queue
            .enqueue(NewJob::new(&self.source, event_id, body))
            .await?
        {
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

    /// An axum router answering `POST /` with this receiver: 202 with
    /// `{"status":"enqueued"|"duplicate","job":…}`, or a problem.
    pub fn router(self) -> axum::Router {
        let receiver = Arc::new(self);
        axum::Router::new()
            .route(
                "/",
                axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                    let receiver = Arc::clone(&receiver);
                    async move { receiver.answer(&headers, &body).await }
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable())
    }

    async fn answer(&self, headers: &HeaderMap, body: &[u8]) -> axum::response::Response {
        use axum::response::IntoResponse;
        match self.receive(headers, body).await {
            Ok(received) => {
                let (status, id) = match &received {
                    Received::Enqueued(id) => ("enqueued", id),
                    Received::Duplicate(id) => ("duplicate", id),
                };
                (
                    StatusCode::ACCEPTED,
                    axum::Json(serde_json::json!({ "status": status, "job": id.as_str() })),
                )
                    .into_response()
            }
            Err(rejection) => {
                if let Rejection::Queue(e) = &rejection {
                    tracing::error!(source = %self.source, error = %e, "enqueueing a webhook failed");
                }
                let mut response =
                    (rejection.status(), rejection.problem().to_string()).into_response();
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/problem+json"),
                );
                response
            }
        }
    }
}
