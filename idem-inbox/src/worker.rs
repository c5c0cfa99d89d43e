//! The worker: claims jobs, runs the handler under idem's `execute`, and
//! settles each job as done, retried later, or dead-lettered.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::PreparedClaim;
use idem_core::{Error as IdemError, Idempotent, Key, Lease};
use sha2::{Digest, Sha256};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::completer::Completer;
use crate::handler::{Event, Handler, HandlerError};
use crate::queue::{Job, Queue, QueueError};
use idem_core::backoff::Backoff;

/// How a worker runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Handlers run at once (default 8).
    pub concurrency: usize,
    /// Jobs claimed ahead of a free handler (default 0). Claimed early, a
    /// handler that finishes finds its next job without waiting a claim
    /// round trip, and completions overlap running jobs; the waiting jobs'
    /// leases are renewed. While every handler is busy, the worker claims
    /// again once half the prefetch has drained, so claims come in
    /// batches rather than one job each time a job ends. The price: a
    /// worker killed or stalled holds these jobs too until their leases
    /// lapse, and each of them counts a lapse (see [`Worker`]'s "Killed
    /// workers and short leases").
    pub prefetch: usize,
    /// The queue lease of a claimed job, renewed every third of it while the
    /// handler runs (default 60 s). Keep it long: see [`Worker`]'s "Short
    /// leases on an overloaded queue".
    pub lease: Duration,
    /// Attempts before a job goes to the dead letters (default 8): runs of
    /// the handler that ended, in an error or in the worker giving the job
    /// up.
    pub max_attempts: u32,
    /// Lapsed leases before a job goes to the dead letters (default 16):
    /// claims of the job after a worker was killed, or stalled past its
    /// lease, while it held the job. Counted apart from the attempts, so
    /// restarts do not spend the attempts the handler's failures are
    /// allowed; bounded, so an event that kills its worker every time (it
    /// exhausts memory, or never returns and starves the heartbeats) ends
    /// in the dead letters instead of taking workers down forever.
    pub max_lapses: u32,
    /// The wait between failed attempts.
    pub backoff: Backoff,
    /// How long to wait between claims when the queue is empty (default
    /// 200 ms).
    pub poll: Duration,
    /// On shutdown, how long in-flight jobs may finish before they are
    /// released (default 30 s).
    pub grace: Duration,
}

impl Default for WorkerConfig {
    fn default() -> WorkerConfig {
        WorkerConfig {
            concurrency: 8,
            prefetch: 0,
            lease: Duration::from_secs(60),
            max_attempts: 8,
            max_lapses: 16,
            backoff: Backoff::default(),
            poll: Duration::from_millis(200),
            grace: Duration::from_secs(30),
        }
    }
}

impl WorkerConfig {
    /// Sets [`concurrency`](WorkerConfig::concurrency) (at least 1).
    pub fn with_concurrency(mut self, n: usize) -> WorkerConfig {
        self.concurrency = n.max(1);
        self
    }

    /// Sets [`prefetch`](WorkerConfig::prefetch).
    pub fn with_prefetch(mut self, n: usize) -> WorkerConfig {
        self.prefetch = n;
        self
    }

    /// Sets [`lease`](WorkerConfig::lease).
    pub fn with_lease(mut self, lease: Duration) -> WorkerConfig {
        self.lease = lease;
        self
    }

    /// Sets [`max_attempts`](WorkerConfig::max_attempts) (at least 1).
    pub fn with_max_attempts(mut self, n: u32) -> WorkerConfig {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets [`max_lapses`](WorkerConfig::max_lapses) (at least 1).
    pub fn with_max_lapses(mut self, n: u32) -> WorkerConfig {
        self.max_lapses = n.max(1);
        self
    }

    /// Sets [`backoff`](WorkerConfig::backoff).
    pub fn with_backoff(mut self, backoff: Backoff) -> WorkerConfig {
        self.backoff = backoff;
        self
    }

    /// Sets [`poll`](WorkerConfig::poll).
    pub fn with_poll(mut self, poll: Duration) -> WorkerConfig {
        self.poll = poll;
        self
    }

    /// Sets [`grace`](WorkerConfig::grace).
    pub fn with_grace(mut self, grace: Duration) -> WorkerConfig {
        self.grace = grace;
        self
    }
}

/// How one job ended in this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler succeeded (or its recorded success replayed); the job is
    /// done.
    Completed,
    /// It failed and was put back, due after a delay.
    Retried,
    /// It went to the dead letters.
    DeadLettered,
    /// Shutdown released it unfinished.
    Released,
    /// Another worker claimed it meanwhile; this one's settle changed
    /// nothing.
    LeaseLost,
}

/// Claims jobs from a [`Queue`] and runs a [`Handler`] on each under
/// idem's `execute`, keyed by (source, event id).
///
/// * At most [`concurrency`](WorkerConfig::concurrency) handlers run at
///   once, and the worker holds at most that many claimed jobs plus
///   [`prefetch`](WorkerConfig::prefetch) (default 0): prefetched jobs
///   wait for a free handler with their queue leases renewed, so a
///   handler that finishes finds its next job claimed already and a job's
///   completion goes to the queue while the next one runs.
/// * The queue lease is renewed while the handler runs; idem's own lease
///   on the event's key is renewed by `execute`.
/// * `Ok` completes the job. Completions of jobs that finish while
///   another completion is on its way are sent together as one
///   [`Queue::complete_many`] (one statement on PostgreSQL, one commit on
///   SQLite), each still fenced by its own token; a lone completion goes
///   at once. A redelivered job whose handler already
///   succeeded (the worker died between the handler and the completion)
///   replays the recorded success and completes without running again.
/// * A retryable error puts the job back after [`Backoff`] (or the error's
///   `Retry-After`); a permanent error, an event whose payload changed under
///   the same id, or a job out of attempts goes to the dead letters with its
///   history.
///
/// The [`Idempotent`]'s retention should outlast the longest span over
/// which a job is retried, or a late retry runs the handler afresh.
///
/// # Killed workers and short leases
///
/// A claim that follows a lapsed lease counts a lapse, not an attempt:
/// a worker killed in the middle of its jobs (a deployment, an
/// out-of-memory kill, a crash) costs each of them one of
/// [`max_lapses`](WorkerConfig::max_lapses) and none of
/// [`max_attempts`](WorkerConfig::max_attempts). Past `max_lapses` the
/// job is dead-lettered without running ("gave up after N lapsed
/// leases"): an event that kills its worker every time stops there.
///
/// A stall is dearer. On an overloaded machine — a starved runtime, a
/// queue database slow to answer, a pause longer than a third of the
/// lease — heartbeats arrive late, the lease lapses, another worker claims
/// the job (a lapse) and finds the event in flight under idem's own lease,
/// and puts the job back; that round's next claim counts an attempt
/// without the handler failing at all. With a short lease and few
/// attempts a healthy event can end in the dead letters ("another worker
/// is handling this event"). No effect is repeated or lost — the handler
/// is still fenced by idem — but a person must requeue it. So: keep the
/// lease well above the longest pause the worker's host can suffer (the
/// 60 s default, not the sub-second leases of the tests), size
/// [`concurrency`](WorkerConfig::concurrency) so that claimed jobs do not
/// wait for a runtime thread, and allow attempts for the stalls the host
/// can have, on top of the handler's own failures; allow lapses for the
/// restarts a deployment expects.
pub struct Worker {
    queue: Arc<dyn Queue>,
    completer: Arc<Completer>,
    idem: Idempotent,
    handler: Arc<dyn Handler>,
    config: WorkerConfig,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("queue", &self.queue)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker over `queue`, recording outcomes with `idem`, running
    /// `handler`.
    pub fn new(queue: Arc<dyn Queue>, idem: Idempotent, handler: impl Handler) -> Worker {
        Worker {
            completer: Arc::new(Completer::new(Arc::clone(&queue))),
            queue,
            idem,
            handler: Arc::new(handler),
            config: WorkerConfig::default(),
        }
    }

    /// Runs with `config`.
    pub fn with_config(mut self, config: WorkerConfig) -> Worker {
        self.config = config;
        self
    }

    /// Runs until `shutdown` resolves, then stops claiming, gives in-flight
    /// jobs the [grace](WorkerConfig::grace) to finish, releases the rest,
    /// and returns. A queue failure while claiming is retried after the
    /// poll interval; it does not stop the worker.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        // Claimed jobs held at once: the handlers and the prefetch.
        let held_at_most = self.config.concurrency.saturating_add(self.config.prefetch);
        let permits = Arc::new(Semaphore::new(held_at_most));
        let handlers = Arc::new(Semaphore::new(self.config.concurrency));
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut depth_read: Option<std::time::Instant> = None;
        // Whether the queue's shared commits may carry idem's records: not
        // yet known until a check succeeds (a failed check is tried again
        // at the next claim), then known for the run.
        let mut shared: Option<bool> = None;
        loop {
            while tasks.try_join_next().is_some() {}
            if depth_read.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                crate::metrics::queue_depth(&*self.queue).await;
                depth_read = Some(std::time::Instant::now());
            }
            let free = permits.available_permits();
            // A handler may be idle: claim now. Otherwise every handler is
            // busy and prefetched jobs wait: claim once half the prefetch
            // has drained, so claims come in batches instead of one job at
            // a time as each job ends (a claim costs a statement and a
            // commit whatever its size), and the jobs still waiting cover
            // the claim's round trip.
            let held = held_at_most - free;
            let worth_claiming = free > 0
                && (held < self.config.concurrency || free >= self.config.prefetch.div_ceil(2));
            let claimed = if !worth_claiming {
                Ok(Vec::new())
            } else {
                if shared.is_none() {
                    shared = self.check_shared().await;
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    claimed = self.claim(free, shared == Some(true)) => claimed,
                }
            };
            let jobs = match claimed {
                Ok(jobs) => jobs,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming jobs failed; trying again");
                    Vec::new()
                }
            };
            if jobs.is_empty() {
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(self.config.poll) => {}
                    // A finished job frees room to claim.
                    Some(_) = tasks.join_next(), if !worth_claiming => {}
                }
                continue;
            }
            crate::metrics::claimed(jobs.len());
            for (job, lease) in jobs {
                if lease.is_some() {
                    crate::metrics::key_claimed_with_job(&job.source);
                }
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    // Cannot happen: no more than `free` jobs were claimed.
                    let _ = self.queue.release(&job).await;
                    if let Some(lease) = lease {
                        let _ = lease.release().await;
                    }
                    crate::metrics::finished();
                    continue;
                };
                let ctx = JobContext {
                    queue: Arc::clone(&self.queue),
                    completer: Arc::clone(&self.completer),
                    idem: self.idem.clone(),
                    handler: Arc::clone(&self.handler),
                    handlers: Some(Arc::clone(&handlers)),
                    config: self.config.clone(),
                    stop: stop_rx.clone(),
                };
                tasks.spawn(async move {
                    let outcome = ctx.process(job, lease).await;
                    drop(permit);
                    outcome
                });
            }
        }
        // Let in-flight jobs finish within the grace, then release the rest.
        let drained = tokio::time::timeout(self.config.grace, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            let _ = stop_tx.send(true);
            while tasks.join_next().await.is_some() {}
        }
    }

    /// Claims and handles one batch of up to `max` jobs, waiting for each to
    /// settle; returns what became of each. For tests and tools that drive
    /// the queue step by step.
    pub async fn run_once(&self, max: usize) -> Result<Vec<Outcome>, QueueError> {
        crate::metrics::queue_depth(&*self.queue).await;
        let shared = self.check_shared().await == Some(true);
        let jobs = self.claim(max, shared).await?;
        crate::metrics::claimed(jobs.len());
        let (_stop_tx, stop_rx) = watch::channel(false);
        let mut outcomes = Vec::with_capacity(jobs.len());
        for (job, lease) in jobs {
            if lease.is_some() {
                crate::metrics::key_claimed_with_job(&job.source);
            }
            let ctx = JobContext {
                queue: Arc::clone(&self.queue),
                completer: Arc::clone(&self.completer),
                idem: self.idem.clone(),
                handler: Arc::clone(&self.handler),
                handlers: None,
                config: self.config.clone(),
                stop: stop_rx.clone(),
            };
            outcomes.push(ctx.process(job, lease).await?);
        }
        Ok(outcomes)
    }

    /// Claims up to `max` jobs; through the queue's shared commits, with
    /// idem's claims of their keys, when `shared`.
    async fn claim(
        &self,
        max: usize,
        shared: bool,
    ) -> Result<Vec<(Job, Option<Lease>)>, QueueError> {
        match self.queue.shared_commit().filter(|_| shared) {
            Some(commits) => {
                let prepare = |job: &Job| self.prepare_claim(job);
                commits
                    .claim_with_keys(max, self.config.lease, &prepare)
                    .await
            }
            None => Ok(self
                .queue
                .claim(max, self.config.lease)
                .await?
                .into_iter()
                .map(|job| (job, None))
                .collect()),
        }
    }

    /// idem's claim of `job`'s event key, as [`handle_once`] would make
    /// it; none for a job that will be dead-lettered without running.
    fn prepare_claim(&self, job: &Job) -> Option<PreparedClaim> {
        if job.lapses > self.config.max_lapses || job.attempts > self.config.max_attempts {
            return None;
        }
        self.idem
            .scoped(job.source.clone())
            .prepare_claim(&event_key(&job.event_id), &payload_digest(&job.payload))
            .ok()
    }

    /// Whether the queue's shared commits write where this worker's
    /// `Idempotent` reads: `Some(false)` for a queue without them or a
    /// store that does not see what they write, `None` when the check
    /// could not be made (a backend failure; checked again later).
    ///
    /// The check claims a key of its own through the queue and releases it
    /// through the `Idempotent`'s store: the release finds the claim only
    /// in the same store.
    async fn check_shared(&self) -> Option<bool> {
        let Some(commits) = self.queue.shared_commit() else {
            return Some(false);
        };
        let mut nonce = [0u8; 16];
        rand::Rng::fill(&mut rand::rng(), &mut nonce[..]);
        let probe = self
            .idem
            .scoped("idem-inbox")
            .prepare_claim(&format!("store-check-{}", hex::encode(nonce)), "")
            .ok()?;
        match commits.claim_keys(std::slice::from_ref(&probe)).await {
            Ok(inserted) if inserted == [true] => {}
            Ok(_) => return Some(false),
            Err(e) => {
                tracing::warn!(error = %e, "checking the queue's shared commits failed; trying again");
                return None;
            }
        }
        match probe.inserted().release().await {
            Ok(()) => Some(true),
            Err(IdemError::LeaseLost) => {
                tracing::error!(
                    "the queue writes idem's records to another store than the worker's \
                     Idempotent reads; keeping them apart (give the queue the worker's store)"
                );
                Some(false)
            }
            Err(e) => {
                tracing::warn!(error = %e, "checking the queue's shared commits failed; trying again");
                None
            }
        }
    }
}

/// The body an event is fingerprinted by: its payload's digest, so the same
/// event id with another payload is a mismatch, not a replay.
fn payload_digest(payload: &[u8]) -> String {
    hex::encode(Sha256::digest(payload))
}

/// The idem client key an event is handled under, within the scope of its
/// source: the event id when it is a valid key, else `sha256:` and the hex
/// digest of the id.
pub fn event_key(event_id: &str) -> String {
    if Key::validate_client_key(event_id).is_ok() && !event_id.starts_with("sha256:") {
        event_id.to_owned()
    } else {
        format!(
            "sha256:{}",
            hex::encode(Sha256::digest(event_id.as_bytes()))
        )
    }
}

/// Runs `handler` for the event under `idem`, as a worker does: scoped to
/// the source, keyed by [`event_key`], fingerprinted by the payload.
pub async fn handle_once(
    idem: &Idempotent,
    handler: &dyn Handler,
    event: &Event,
) -> Result<(), IdemError<HandlerError>> {
    idem.scoped(event.source.clone())
        .execute(
            &event_key(&event.id),
            &payload_digest(&event.payload),
            || handler.handle(event),
        )
        .await
}

/// What `execute` records for a handler's `Ok(())`: its JSON.
const RECORDED_OK: &[u8] = b"null";

/// Runs the handler under a lease the worker already holds, as `execute`
/// runs work under the lease it claims: renewed while it waits for `room`
/// and runs; a success is recorded at once (the moment between an effect
/// and its record is the one a killed worker can repeat, so it is kept as
/// short as `execute` keeps it), a failure gives the key back (unless the
/// lease was lost).
async fn run_leased(
    lease: Lease,
    room: impl Future<Output = Option<tokio::sync::OwnedSemaphorePermit>>,
    handler: &dyn Handler,
    event: &Event,
) -> Result<(), IdemError<HandlerError>> {
    let ran = lease
        .run(async {
            let _room = room.await;
            handler.handle(event).await
        })
        .await;
    match ran.output {
        Ok(()) if ran.lease_lost => Err(IdemError::LeaseLost),
        Ok(()) => lease
            .complete(RECORDED_OK)
            .await
            .map_err(IdemError::into_work_error),
        Err(error) => {
            if !ran.lease_lost {
                if let Err(settle) = lease.release().await {
                    // The handler's own error is what counts; the key stays
                    // claimed until its lease lapses.
                    tracing::warn!(error = %settle,
                        "could not give the key back after the handler failed");
                }
            }
            Err(IdemError::Work(error))
        }
    }
}

struct JobContext {
    queue: Arc<dyn Queue>,
    completer: Arc<Completer>,
    idem: Idempotent,
    handler: Arc<dyn Handler>,
    /// The room to run a handler in, when the caller bounds it.
    handlers: Option<Arc<Semaphore>>,
    config: WorkerConfig,
    stop: watch::Receiver<bool>,
}

/// What to do with a job once its run ended.
enum Verdict {
    Complete,
    Retry { delay: Duration, error: String },
    Dead(String),
}

impl JobContext {
    /// Handles one claimed job to its settlement, and counts it.
    async fn process(self, job: Job, lease: Option<Lease>) -> Result<Outcome, QueueError> {
        let started = std::time::Instant::now();
        let source = job.source.clone();
        let outcome = self.run_and_settle(job, lease).await;
        if let Ok(settled) = &outcome {
            crate::metrics::settled(&source, *settled, started.elapsed());
        }
        crate::metrics::finished();
        outcome
    }

    async fn run_and_settle(
        mut self,
        job: Job,
        lease: Option<Lease>,
    ) -> Result<Outcome, QueueError> {
        let last_error = || {
            job.last_error
                .clone()
                .unwrap_or_else(|| "none (a worker stopped mid-job or overran its lease)".into())
        };
        if job.lapses > self.config.max_lapses {
            // Claimed once too often after lapsed leases: its holders were
            // killed, or stalled past their leases, every time.
            // Every lapse counted, this claim's included, is a lease that
            // lapsed: unlike an attempt, none of them is this claim's own.
            let error = format!(
                "gave up after {} lapsed leases (workers stopped or stalled holding it); \
                 last error: {}",
                job.lapses,
                last_error()
            );
            return self.settle(&job, Verdict::Dead(error)).await;
        }
        if job.attempts > self.config.max_attempts {
            // Claimed past its attempts: a queue that counts every claim
            // as an attempt, or a limit lowered since the last attempt.
            let error = format!(
                "gave up after {} attempts; last error: {}",
                job.attempts - 1,
                last_error()
            );
            return self.settle(&job, Verdict::Dead(error)).await;
        }
        let event = Event::of_job(&job);
        let (idem, handler, handlers) = (&self.idem, &*self.handler, self.handlers.clone());
        // Whether the handler got a room to run in: a held idem lease on a
        // job given back before then can be given back too.
        let started = std::sync::atomic::AtomicBool::new(false);
        let held = lease.clone();
        // A claimed job waits here for a free handler, its queue lease
        // renewed by the heartbeats below; idem's lease on the event starts
        // only once it runs (or, claimed through shared commits, is renewed
        // while it waits). The room is given back when the handler ends,
        // so the next job runs while this one's completion is on its way.
        let run = async {
            let room = async {
                let room = match handlers {
                    Some(handlers) => handlers.acquire_owned().await.ok(),
                    None => None,
                };
                started.store(true, std::sync::atomic::Ordering::Relaxed);
                room
            };
            match held {
                None => {
                    let _room = room.await;
                    handle_once(idem, handler, &event).await
                }
                Some(lease) => run_leased(lease, room, handler, &event).await,
            }
        };
        let mut run = std::pin::pin!(run);
        let mut beat = tokio::time::interval(self.config.lease / 3);
        beat.tick().await;
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                _ = beat.tick() => {
                    // A lost queue lease is not a reason to stop: the idem
                    // lease still fences the handler, and the new holder
                    // will replay this run's outcome.
                    if let Err(e) = self.queue.heartbeat(&job, self.config.lease).await {
                        tracing::warn!(job = %job.id, error = %e, "heartbeat failed");
                    }
                }
                Ok(()) = self.stop.changed() => {
                    if *self.stop.borrow() {
                        // Past the grace: give the job back. Dropping the
                        // run leaves its idem record in flight until its
                        // lease lapses, so the next holder cannot repeat a
                        // half-done effect early; a key claimed for a job
                        // whose handler never started goes back at once.
                        if let Some(lease) = &lease {
                            if !started.load(std::sync::atomic::Ordering::Relaxed) {
                                let _ = lease.release().await;
                            }
                        }
                        return Ok(match self.queue.release(&job).await?.is_applied() {
                            true => Outcome::Released,
                            false => Outcome::LeaseLost,
                        });
                    }
                }
            }
        };
        let verdict = match result {
            Ok(()) => Verdict::Complete,
            Err(IdemError::Work(e)) if e.is_permanent() => Verdict::Dead(e.to_string()),
            Err(IdemError::Work(e)) => self.retry_or_dead(&job, e.retry_after(), e.to_string()),
            Err(IdemError::InProgress { retry_after }) => Verdict::Retry {
                // Another worker runs this event now (its queue lease lapsed
                // while it kept going); look again once its lease would end.
                delay: retry_after,
                error: "another worker is handling this event".to_owned(),
            },
            Err(e @ (IdemError::Mismatch | IdemError::InvalidKey(_) | IdemError::Decode(_))) => {
                Verdict::Dead(e.to_string())
            }
            Err(e) => self.retry_or_dead(&job, None, e.to_string()),
        };
        self.settle(&job, verdict).await
    }

    fn retry_or_dead(&self, job: &Job, retry_after: Option<Duration>, error: String) -> Verdict {
        if job.attempts >= self.config.max_attempts {
            return Verdict::Dead(error);
        }
        let delay = retry_after.unwrap_or_else(|| self.config.backoff.delay(job.attempts));
        Verdict::Retry { delay, error }
    }

    async fn settle(&self, job: &Job, verdict: Verdict) -> Result<Outcome, QueueError> {
        let (settle, outcome) = match verdict {
            Verdict::Complete => (self.completer.complete(job).await?, Outcome::Completed),
            Verdict::Retry { delay, error } => (
                self.queue.retry(job, delay, &error).await?,
                Outcome::Retried,
            ),
            Verdict::Dead(error) => (
                self.queue.dead_letter(job, &error).await?,
                Outcome::DeadLettered,
            ),
        };
        Ok(if settle.is_applied() {
            outcome
        } else {
            Outcome::LeaseLost
        })
    }
}
