//! Helpers the cases share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::queue::{Enqueued, Job, JobId, NewJob, Queue, Settle};

/// A lease for cases that wait for it to lapse.
pub(crate) const LEASE: Duration = Duration::from_millis(300);

/// A lease no case outlives.
pub(crate) const LONG: Duration = Duration::from_secs(30);

/// Extra time past a deadline before a case relies on it having passed.
pub(crate) const SLACK: Duration = Duration::from_millis(50);

/// How long bounded polling waits for a queue to show a state.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);

/// How often bounded polling looks.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// A source name unique within the process, so cases never meet.
pub(crate) fn source(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{name}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Enqueues and expects a new job.
pub(crate) async fn enqueue_new(queue: &dyn Queue, job: NewJob) -> JobId {
    match queue.enqueue(job).await {
        Ok(Enqueued::New(id)) => id,
        Ok(other) => panic!("enqueue of a new event returned {other:?}"),
        Err(e) => panic!("enqueue failed: {e}"),
    }
}

/// Claims, failing the case on a backend error.
pub(crate) async fn claim(queue: &dyn Queue, max: usize, lease: Duration) -> Vec<Job> {
    queue
        .claim(max, lease)
        .await
        .unwrap_or_else(|e| panic!("claim failed: {e}"))
}

/// Claims one job, polling until one is due, within [`PATIENCE`].
pub(crate) async fn claim_one(queue: &dyn Queue, lease: Duration) -> Job {
    let give_up = Instant::now() + PATIENCE;
    loop {
        if let Some(job) = claim(queue, 1, lease).await.pop() {
            return job;
        }
        assert!(
            Instant::now() < give_up,
            "no job became due within {PATIENCE:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Unwraps a settle, failing the case on a backend error.
pub(crate) fn settled(result: Result<Settle, crate::queue::QueueError>, what: &str) -> Settle {
    result.unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

/// Waits until `lease` has surely lapsed on the backend's clock.
pub(crate) async fn past(lease: Duration) {
    tokio::time::sleep(lease + SLACK).await;
}
