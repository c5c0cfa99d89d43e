//! The webhooks demo's worker: claims jobs from the inbox queue and runs a
//! handler that "replies" through a rate-limited outbound API which fails
//! now and then, making its effect once in the store's database.

use std::sync::Arc;
use std::time::Duration;

use idem_core::backoff::Backoff;
use idem_http::ratelimit::RateLimiter;
use idem_inbox::queue::Queue;
use idem_inbox::{Event, HandlerError, Worker, WorkerConfig};

use super::effects::EffectBook;
use crate::webhooks::{InboxSpec, WebhooksError, DEMO_LEASE};

/// The outbound API's destination name for the rate limiter.
const REPLIES: &str = "replies";

/// Attempts before an event goes to the dead letters: room for the flaky
/// events' failures and for a stall past the lease. Killed workers cost
/// lapses, which the worker counts apart (its default limit, 16).
pub(crate) const MAX_ATTEMPTS: u32 = 8;

/// What the demo's payloads carry: the event's number, how many first
/// attempts the outbound API fails, and whether it always fails.
#[derive(Debug, serde::Deserialize)]
struct Payload {
    n: u64,
    #[serde(default)]
    flaky: u32,
    #[serde(default)]
    poison: bool,
}

/// Runs the demo's worker over `inbox` until `shutdown` resolves.
pub async fn run_webhooks_worker(
    inbox: &InboxSpec,
    concurrency: usize,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), WebhooksError> {
    let queue = inbox.open_queue().await?;
    let book = EffectBook::open(inbox)
        .await
        .map_err(WebhooksError::Store)?;
    let idem = book.idem(DEMO_LEASE).with_namespace("idem-demo-webhooks");
    let limiter = RateLimiter::new(5_000.0, 100);
    let handler = move |event: Event| {
        let (book, limiter) = (book.clone(), limiter.clone());
        async move { handle(&book, &limiter, event).await }
    };
    let config = WorkerConfig::default()
        .with_concurrency(concurrency)
        .with_lease(DEMO_LEASE)
        .with_max_attempts(MAX_ATTEMPTS)
        .with_poll(Duration::from_millis(10))
        .with_grace(Duration::from_secs(5))
        // A short base for the demo, so retries show within a second.
        .with_backoff(Backoff::new(
            Duration::from_millis(5),
            Duration::from_millis(200),
        ));
    let queue: Arc<dyn Queue> = queue;
    Worker::new(queue, idem, handler)
        .with_config(config)
        .run(shutdown)
        .await;
    Ok(())
}

async fn handle(
    book: &EffectBook,
    limiter: &RateLimiter,
    event: Event,
) -> Result<(), HandlerError> {
    let payload: Payload = serde_json::from_slice(&event.payload)
        .map_err(|e| HandlerError::permanent(format!("not a demo event: {e}")))?;
    // A little work before the effect, so a kill can land mid-job.
    tokio::time::sleep(Duration::from_millis(payload.n % 4)).await;
    if payload.poison {
        return Err(HandlerError::retryable(
            "outbound API: 500 (this event always fails)",
        ));
    }
    if event.attempt <= payload.flaky {
        if payload.n % 2 == 0 {
            let wait = Duration::from_millis(20);
            limiter.pause(REPLIES, wait);
            return Err(HandlerError::retryable("outbound API: 429").with_retry_after(wait));
        }
        return Err(HandlerError::retryable("outbound API: 503"));
    }
    limiter.acquire(REPLIES).await;
    book.make(&event, DEMO_LEASE)
        .await
        .map_err(|e| HandlerError::retryable(format!("the reply was not recorded: {e}")))
}
