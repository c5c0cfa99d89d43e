//! The durable job queue the inbox enqueues into and workers claim from.
//!
//! A [`Queue`] holds one job per (source, event id). Enqueueing an event the
//! queue already holds is reported as [`Enqueued::Duplicate`] and queues
//! nothing; a completed job keeps its place for the dedupe retention (three
//! days by default, the longest a common provider keeps resending), so a
//! late resend is still recognised.
//!
//! Workers [`claim`](Queue::claim) due jobs in batches. A claim holds a job
//! for a lease and gives it a fresh [`Token`]; every later transition of that
//! job — [`heartbeat`](Queue::heartbeat), [`complete`](Queue::complete),
//! [`retry`](Queue::retry), [`release`](Queue::release),
//! [`dead_letter`](Queue::dead_letter) — is fenced by the token: it applies
//! only while no one else has claimed the job since, and otherwise returns
//! [`Settle::LeaseLost`] and changes nothing. A job whose lease lapses is due
//! again, so a crashed or stalled worker loses nothing and holds nothing.
//!
//! Policy — how long to wait before a retry, when to give up — lives in the
//! worker, not here: a queue only does what it is told, atomically.

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::PreparedClaim;
use idem_core::Lease;
use serde::{Deserialize, Serialize};

#[cfg(feature = "postgres")]
pub use postgres::{PostgresQueue, DEFAULT_ENQUEUE_GROUPS};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteQueue;

/// How long a queue remembers a completed event, by default: Stripe resends
/// for three days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(3 * 24 * 60 * 60);

/// A durable queue of jobs, one per (source, event id).
///
/// # Contract
///
/// Every method is one atomic operation on the queue.
///
/// * [`enqueue`](Queue::enqueue) MUST insert a pending job due after the
///   job's delay when the queue holds no job for its (source, event id), and
///   MUST otherwise insert nothing and return [`Enqueued::Duplicate`] —
///   whatever state the held job is in. It MUST likewise return
///   [`Enqueued::Duplicate`] when a held job carries, among its
///   [`dedupe_keys`](NewJob::dedupe_keys), one of the new job's, and
///   MUST remember the new job's keys with whichever job it returns (a
///   job enqueued by an earlier build, held by its event id, then gains
///   them). A completed job MAY be forgotten, with its keys, once the
///   retention has passed since it was enqueued, and not before.
/// * [`claim`](Queue::claim) MUST return at most `max` jobs, each due (pending
///   with `run_after` passed, or running with its lease lapsed), MUST give
///   each a new token and a lease of `lease` from now on the backend's clock,
///   and MUST NOT return one job to two concurrent claims. A pending job's
///   claim MUST count one more attempt; a claim of a job whose lease lapsed
///   MUST count one more lapse instead and leave its attempts as they were
///   (the attempt that lapsed never ended, and this claim carries it on), so
///   workers killed holding a job do not spend the attempts its handler's
///   failures are allowed.
/// * [`release`](Queue::release) MUST give back the attempt its claim
///   counted, so a released job's next claim counts it again.
/// * The settling methods MUST apply only when the job is running under the
///   given token, and MUST otherwise change nothing and return
///   [`Settle::LeaseLost`]. A worker whose lease lapsed MAY still settle
///   while nobody has claimed the job since.
/// * A completed job MUST never be claimed again; a dead letter MUST NOT be
///   claimed until [`requeue`](Queue::requeue)d.
/// * Deadlines MUST be kept on one clock (the database's, where there is
///   one), so workers with skewed clocks cannot steal a live lease.
#[async_trait]
pub trait Queue: Send + Sync + fmt::Debug + 'static {
    /// Adds `job` unless the queue already holds its (source, event id) or
    /// one of its (source, dedupe key).
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued, QueueError>;

    /// Claims up to `max` due jobs, each held for `lease`.
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Job>, QueueError>;

    /// Extends the lease of a held job to `lease` from now.
    async fn heartbeat(&self, job: &Job, lease: Duration) -> Result<Settle, QueueError>;

    /// Marks a held job done for good.
    async fn complete(&self, job: &Job) -> Result<Settle, QueueError>;

    /// Marks several held jobs done, each fenced by its own token as
    /// [`complete`](Queue::complete) is; returns one [`Settle`] per job, in
    /// order. Workers group the completions of jobs that finish together
    /// into one call, so a backend that can settle them in one statement
    /// or one commit makes each completion cost a fraction of a round trip.
    ///
    /// Each job's completion MUST be atomic on its own; the batch as a
    /// whole need not be: after an error some of the jobs may have been
    /// completed (a retried completion of those is [`Settle::LeaseLost`]).
    /// The default completes the jobs one by one — correct for every
    /// backend, so queues written before it still compile, and only slower
    /// than a backend's own batch.
    async fn complete_many(&self, jobs: &[Job]) -> Result<Vec<Settle>, QueueError> {
        let mut settled = Vec::with_capacity(jobs.len());
        for job in jobs {
            settled.push(self.complete(job).await?);
        }
        Ok(settled)
    }

    /// Returns a held job to the queue, due after `delay`, recording `error`
    /// as its last error and in its history.
    async fn retry(&self, job: &Job, delay: Duration, error: &str) -> Result<Settle, QueueError>;

    /// Returns a held job to the queue, due now, without counting the
    /// attempt: the worker is shutting down and did not run it.
    async fn release(&self, job: &Job) -> Result<Settle, QueueError>;

    /// Parks a held job as a dead letter with `error`; it is not claimed
    /// again unless requeued.
    async fn dead_letter(&self, job: &Job, error: &str) -> Result<Settle, QueueError>;

    /// Up to `limit` dead letters, oldest first.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<JobInfo>, QueueError>;

    /// The job `id`, in whatever state, or `None`.
    async fn inspect(&self, id: &JobId) -> Result<Option<JobInfo>, QueueError>;

    /// Makes the dead letter `id` due now with its attempts and lapses
    /// reset; returns
    /// whether there was such a dead letter.
    async fn requeue(&self, id: &JobId) -> Result<bool, QueueError>;

    /// Deletes up to `limit` completed jobs past their retention; returns
    /// how many.
    async fn purge_expired(&self, limit: usize) -> Result<u64, QueueError>;

    /// The queue's depth: jobs not yet done or dead (pending, due or not,
    /// and running), or `None` for a queue that cannot count them cheaply.
    /// Workers export it as the `idem_inbox_queue_depth` gauge. The
    /// default is `None`, so queues written before it still compile.
    async fn depth(&self) -> Result<Option<u64>, QueueError> {
        Ok(None)
    }

    /// The queue's [`SharedCommit`], when it commits idem's claims
    /// together with its own claims of jobs; `None` (the default) when
    /// idem's records live apart, so queues written before it still
    /// compile.
    fn shared_commit(&self) -> Option<&dyn SharedCommit> {
        None
    }
}

/// A queue that writes idem's claims in its own commits: the claims of a
/// batch of jobs' event keys in the commit that claims the jobs, where a
/// worker otherwise makes one claim and one commit per job. What a found
/// record means stays idem-core's decision: a key this queue could not
/// claim goes through `execute` as usual. (Outcomes are recorded as
/// `execute` records them, the moment the handler returns: the time
/// between an effect and its record is what a killed worker can repeat,
/// and waiting to record it with the job's completion lengthened it.)
///
/// A [`Worker`](crate::Worker) uses it when its queue offers one, and
/// checks first that its `Idempotent` sees the records the queue writes
/// (the same store: same table, same database); if not, it logs an error
/// and keeps the records apart.
#[async_trait]
pub trait SharedCommit: Send + Sync {
    /// Inserts the claims, each as idem's `insert` would, in one commit;
    /// returns, in order, whether each was inserted.
    async fn claim_keys(&self, claims: &[PreparedClaim]) -> Result<Vec<bool>, QueueError>;

    /// Claims up to `max` due jobs as [`Queue::claim`] does and, in the same
    /// commit, inserts the idem claim `prepare` gives for each job (none
    /// for a job it gives `None`). Returns each job with its claim's
    /// [`Lease`] when the claim was inserted, `None` otherwise.
    async fn claim_with_keys(
        &self,
        max: usize,
        lease: Duration,
        prepare: &(dyn for<'j> Fn(&'j Job) -> Option<PreparedClaim> + Send + Sync),
    ) -> Result<Vec<(Job, Option<Lease>)>, QueueError>;
}

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewJob {
    /// Who sent the event: `"stripe"`, `"github"`, a tenant's endpoint.
    pub source: String,
    /// The event's id within its source.
    pub event_id: String,
    /// The bytes the handler gets.
    pub payload: Vec<u8>,
    /// How long after enqueueing the job becomes due.
    pub delay: Duration,
    /// Further keys, within the source, the job is deduped on besides its
    /// event id: the [`Receiver`](crate::Receiver) adds the body's digest
    /// (`sha256:<hex>`) for schemes whose signature covers neither the id
    /// nor a timestamp, so a captured delivery resent under a new id is
    /// still a duplicate. Empty for most jobs.
    pub dedupe_keys: Vec<String>,
}

impl NewJob {
    /// A job for event `event_id` from `source`, due now.
    pub fn new(
        source: impl Into<String>,
        event_id: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> NewJob {
        NewJob {
            source: source.into(),
            event_id: event_id.into(),
            payload: payload.into(),
            delay: Duration::ZERO,
            dedupe_keys: Vec::new(),
        }
    }

    /// Also a duplicate of whichever held job carries `key` among its
    /// [`dedupe_keys`](NewJob::dedupe_keys).
    pub fn with_dedupe_key(mut self, key: impl Into<String>) -> NewJob {
        self.dedupe_keys.push(key.into());
        self
    }

    /// Due only after `delay`.
    pub fn with_delay(mut self, delay: Duration) -> NewJob {
        self.delay = delay;
        self
    }
}

/// What [`Queue::enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// A new job.
    New(JobId),
    /// The queue already holds the event, as this job; nothing was added.
    Duplicate(JobId),
}

impl Enqueued {
    /// The job, new or already held.
    pub fn id(&self) -> &JobId {
        match self {
            Enqueued::New(id) | Enqueued::Duplicate(id) => id,
        }
    }
}

/// What a fenced transition did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Settle {
    /// It applied: the caller held the job.
    Applied,
    /// It changed nothing: the job was claimed by someone else since, or is
    /// no longer running.
    LeaseLost,
}

impl Settle {
    /// Whether it applied.
    pub fn is_applied(self) -> bool {
        self == Settle::Applied
    }
}

/// A job's id within its queue: opaque, so a broker can use its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(String);

impl JobId {
    /// An id from its text.
    pub fn new(id: impl Into<String>) -> JobId {
        JobId(id.into())
    }

    /// Its text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The proof a claim gives: opaque bytes, new at every claim.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Vec<u8>);

impl Token {
    /// A token from the bytes a backend keeps.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Token {
        Token(bytes.into())
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({})", hex::encode(&self.0))
    }
}

/// A claimed job: what the handler needs and the token that settles it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Who sent the event.
    pub source: String,
    /// The event's id within its source.
    pub event_id: String,
    /// The bytes enqueued.
    pub payload: Vec<u8>,
    /// Attempts so far, this one included (1 on the first claim). A claim
    /// that follows a lapsed lease carries on the attempt that lapsed and
    /// counts a [`lapse`](Job::lapses) instead.
    pub attempts: u32,
    /// Claims of this job that followed a lapsed lease — a worker killed,
    /// or stalled past its lease, while it held the job — this one
    /// included when it is one.
    pub lapses: u32,
    /// The error the previous attempt ended with, if any.
    pub last_error: Option<String>,
    /// The claim's token.
    pub token: Token,
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum JobState {
    /// Waiting to be due or claimed.
    Pending,
    /// Held by a worker (or its lease lapsed and it is due again).
    Running,
    /// Completed.
    Done,
    /// Parked as a dead letter.
    Dead,
}

impl JobState {
    /// The name backends store.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Dead => "dead",
        }
    }

    /// The state a stored name stands for.
    pub fn parse(name: &str) -> Option<JobState> {
        Some(match name {
            "pending" => JobState::Pending,
            "running" => JobState::Running,
            "done" => JobState::Done,
            "dead" => JobState::Dead,
            _ => return None,
        })
    }
}

/// One failed attempt, as kept in a job's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Attempt {
    /// Which attempt (1 for the first).
    pub attempt: u32,
    /// How it failed.
    pub error: String,
    /// When it was recorded, in milliseconds since the Unix epoch on the
    /// backend's clock.
    pub at_ms: i64,
}

/// A job as [`Queue::inspect`] and [`Queue::dead_letters`] show it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobInfo {
    /// Its id.
    pub id: JobId,
    /// Who sent the event.
    pub source: String,
    /// The event's id within its source.
    pub event_id: String,
    /// The bytes enqueued.
    pub payload: Vec<u8>,
    /// Where it stands.
    pub state: JobState,
    /// Attempts so far.
    pub attempts: u32,
    /// Claims so far that followed a lapsed lease.
    pub lapses: u32,
    /// The error the last failed attempt ended with.
    pub last_error: Option<String>,
    /// Every failed attempt, oldest first.
    pub history: Vec<Attempt>,
}

/// A queue backend failed; the operation may or may not have applied when
/// the failure came after the request was sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The backend failed.
    #[error("{backend} queue failed: {source}")]
    Backend {
        /// Which backend: `"sqlite"`, `"postgres"`, …
        backend: &'static str,
        /// What it reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A stored job cannot be read back.
    #[error("{backend} queue holds a job it cannot read: {reason}")]
    Corrupt {
        /// Which backend.
        backend: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A name given to the backend (a table) is not acceptable.
    #[error("invalid queue name {0:?}: use 1-48 ASCII letters, digits and underscores, not starting with a digit")]
    InvalidName(String),
}

/// Whether `name` can be spliced into SQL as an identifier.
#[cfg(feature = "postgres")]
pub(crate) fn valid_table_name(name: &str) -> bool {
    // The SQL stores' identifier rule; 48 leaves room for the index names.
    idem_sql::identifier(name, 48).is_ok()
}

/// A duration in whole milliseconds, saturating.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Decodes a stored attempt history; a broken one is corruption.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn decode_history(
    backend: &'static str,
    text: &str,
) -> Result<Vec<Attempt>, QueueError> {
    serde_json::from_str(text).map_err(|e| QueueError::Corrupt {
        backend,
        reason: format!("attempt history: {e}"),
    })
}

/// Decodes a stored state name.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn decode_state(backend: &'static str, name: &str) -> Result<JobState, QueueError> {
    JobState::parse(name).ok_or_else(|| QueueError::Corrupt {
        backend,
        reason: format!("unknown state {name:?}"),
    })
}
