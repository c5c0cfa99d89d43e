//! What the [`Receiver`](crate::Receiver) needs of a queue: enqueue a job
//! once per (source, event id).
//!
//! Every [`Queue`] is an [`Enqueue`] (a blanket impl), so a receiver runs
//! on [`SqliteQueue`](crate::queue::SqliteQueue),
//! [`PostgresQueue`](crate::queue::PostgresQueue) or any third-party queue
//! as before. The trait exists for targets that can take a job but cannot
//! honour the rest of the [`Queue`] contract — a broker (JetStream,
//! RabbitMQ, Redis Streams; see idem-broker) has no fenced settles, no
//! lease of the caller's length and no lookup by id, so a [`Worker`]
//! cannot run on it, but the receiver can publish to it and the broker's
//! own consumer handles the events.
//!
//! [`Worker`]: crate::Worker

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::queue::{Enqueued, NewJob, Queue, QueueError};

/// Takes a verified event's job, once per (source, event id).
///
/// # Contract
///
/// * [`enqueue`](Enqueue::enqueue) MUST return [`Enqueued::New`] only once
///   the job is durable (committed, or confirmed by a broker), so the
///   provider's 2xx never covers a job that can be lost.
/// * It MUST return [`Enqueued::Duplicate`] and add nothing when it already
///   took a job for the same (source, event id) within its retention (at
///   least [`DEFAULT_RETENTION`](crate::queue::DEFAULT_RETENTION), the
///   longest a common provider resends), whatever the payload.
/// * It SHOULD likewise return [`Enqueued::Duplicate`] when a job it took
///   carries one of the job's [`dedupe_keys`](NewJob::dedupe_keys), as
///   every [`Queue`] must. A target that ignores them dedupes on the event
///   id alone, and lets a GitHub delivery resent under a new delivery id
///   through as a new event.
/// * A failure MAY leave the job added (the failure came after the request
///   was sent). The provider resends, and the resend MAY add the job a
///   second time only where whoever handles the jobs dedupes them on the
///   same (source, event id) — as idem's `execute` does in the inbox
///   [`Worker`](crate::Worker) and in idem-broker's consumer.
#[async_trait]
pub trait Enqueue: Send + Sync + fmt::Debug + 'static {
    /// Adds `job` unless a job for its (source, event id) was already
    /// taken.
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued, QueueError>;
}

#[async_trait]
impl<Q: Queue + ?Sized> Enqueue for Q {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued, QueueError> {
        Queue::enqueue(self, job).await
    }
}

/// An `Arc<Q>` as an `Arc<dyn Enqueue>` for any `Q`, sized or not (an
/// `Arc<dyn Queue>` cannot be coerced to one).
pub(crate) struct Shared<Q: ?Sized>(pub(crate) Arc<Q>);

impl<Q: ?Sized + fmt::Debug> fmt::Debug for Shared<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[async_trait]
impl<Q: Enqueue + ?Sized> Enqueue for Shared<Q> {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued, QueueError> {
        self.0.enqueue(job).await
    }
}
