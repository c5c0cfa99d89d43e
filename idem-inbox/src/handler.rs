//! What a worker runs for each event, and how it says a run failed.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

/// One event as the handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Event {
    /// Who sent it.
    pub source: String,
    /// Its id within the source.
    pub id: String,
    /// The raw body received.
    pub payload: Vec<u8>,
    /// Which attempt this is (1 for the first). A run after a worker was
    /// killed holding the event carries on the attempt that was cut off.
    pub attempt: u32,
}

impl Event {
    /// Attempt 1 of event `id` from `source`.
    pub fn new(
        source: impl Into<String>,
        id: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Event {
        Event {
            source: source.into(),
            id: id.into(),
            payload: payload.into(),
            attempt: 1,
        }
    }

    /// The event a claimed job carries.
    pub fn of_job(job: &crate::queue::Job) -> Event {
        Event {
            source: job.source.clone(),
            id: job.event_id.clone(),
            payload: job.payload.clone(),
            attempt: job.attempts,
        }
    }
}

/// Handles events. Runs under idem's `execute` keyed by (source, event id):
/// once it returns `Ok` for an event, a redelivery of that event replays the
/// recorded success instead of running it again.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles `event`.
    async fn handle(&self, event: &Event) -> Result<(), HandlerError>;
}

#[async_trait]
impl<F, Fut> Handler for F
where
    F: Fn(Event) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), HandlerError>> + Send,
{
    async fn handle(&self, event: &Event) -> Result<(), HandlerError> {
        self(event.clone()).await
    }
}

/// Why a handler failed, and whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    message: String,
    permanent: bool,
    retry_after: Option<Duration>,
}

impl HandlerError {
    /// A failure that may pass: the job is retried with backoff until its
    /// attempts run out.
    pub fn retryable(message: impl fmt::Display) -> HandlerError {
        HandlerError {
            message: message.to_string(),
            permanent: false,
            retry_after: None,
        }
    }

    /// A failure no retry can fix (a malformed event, a rejected request):
    /// the job goes to the dead letters at once.
    pub fn permanent(message: impl fmt::Display) -> HandlerError {
        HandlerError {
            message: message.to_string(),
            permanent: true,
            retry_after: None,
        }
    }

    /// Retry no sooner than `delay` — what a `Retry-After` asked for. It
    /// replaces the backoff for this retry.
    pub fn with_retry_after(mut self, delay: Duration) -> HandlerError {
        self.retry_after = Some(delay);
        self
    }

    /// Whether no retry can help.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The delay the failure asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// What went wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HandlerError {}
