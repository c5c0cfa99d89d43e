//! The inbox's metrics, through the `metrics` facade (the application
//! installs the exporter; with none installed every call is a no-op).
//!
//! Labelled by source and outcome, never by event id:
//!
//! * `idem_inbox_received_total{source, result}`: deliveries the receiver
//!   answered, `result` one of `enqueued`, `duplicate`, `unverified`,
//!   `too_large`, `no_event_id`, `queue_failed`.
//! * `idem_inbox_jobs_total{source, outcome}`: jobs a worker settled,
//!   `outcome` one of `completed`, `retried`, `dead_lettered`, `released`,
//!   `lease_lost`; `retried` and `dead_lettered` are the retry and
//!   dead-letter counts.
//! * `idem_inbox_job_seconds{source}`: a job's time from claim to settle.
//! * `idem_inbox_jobs_running`: the jobs a worker holds now (its share of
//!   the queue's depth in flight); `idem_inbox_claimed_total`: jobs claimed.
//! * `idem_inbox_keys_claimed_with_jobs_total{source}`: jobs whose event
//!   key was claimed in the commit that claimed the job, on a queue that
//!   shares idem's commits ([`SharedCommit`](crate::queue::SharedCommit));
//!   it stays at zero where the records are kept apart.
//! * `idem_inbox_queue_depth`: jobs not yet done or dead, from
//!   [`Queue::depth`](crate::queue::Queue::depth), read by a running worker
//!   at most once a second (and by every `run_once`).

use std::time::Duration;

use crate::receiver::{Received, Rejection};
use crate::worker::Outcome;

pub(crate) fn received(source: &str, received: &Result<Received, Rejection>) {
    let result = match received {
        Ok(Received::Enqueued(_)) => "enqueued",
        Ok(Received::Duplicate(_)) => "duplicate",
        Err(Rejection::Unverified(_)) => "unverified",
        Err(Rejection::TooLarge { .. }) => "too_large",
        Err(Rejection::NoEventId(_)) => "no_event_id",
        Err(Rejection::Queue(_)) => "queue_failed",
    };
    metrics::counter!(
        "idem_inbox_received_total",
        "source" => source.to_owned(),
        "result" => result,
    )
    .increment(1);
}

pub(crate) fn settled(source: &str, outcome: Outcome, took: Duration) {
    let outcome = match outcome {
        Outcome::Completed => "completed",
        Outcome::Retried => "retried",
        Outcome::DeadLettered => "dead_lettered",
        Outcome::Released => "released",
        Outcome::LeaseLost => "lease_lost",
    };
    metrics::counter!(
        "idem_inbox_jobs_total",
        "source" => source.to_owned(),
        "outcome" => outcome,
    )
    .increment(1);
    metrics::histogram!("idem_inbox_job_seconds", "source" => source.to_owned())
        .record(took.as_secs_f64());
}

pub(crate) fn claimed(jobs: usize) {
    metrics::counter!("idem_inbox_claimed_total").increment(jobs as u64);
    metrics::gauge!("idem_inbox_jobs_running").increment(jobs as f64);
}

pub(crate) fn key_claimed_with_job(source: &str) {
    metrics::counter!("idem_inbox_keys_claimed_with_jobs_total", "source" => source.to_owned())
        .increment(1);
}

pub(crate) fn finished() {
    metrics::gauge!("idem_inbox_jobs_running").decrement(1.0);
}

/// Reads the queue's depth into its gauge; a queue that cannot count, or a
/// failed count, leaves the gauge as it was.
pub(crate) async fn queue_depth(queue: &dyn crate::queue::Queue) {
    match queue.depth().await {
        Ok(Some(depth)) => metrics::gauge!("idem_inbox_queue_depth").set(depth as f64),
        Ok(None) => {}
        Err(e) => tracing::debug!(error = %e, "counting the queue's depth failed"),
    }
}
