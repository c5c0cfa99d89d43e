//! The worker over a real SQLite queue: each event's effect once, replays
//! after a crash, backoff, Retry-After, dead letters, concurrency, shutdown.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::backoff::Backoff;
use idem_core::{Idempotent, MemoryStore};
use idem_inbox::queue::{JobState, NewJob, Queue};
use idem_inbox::worker::handle_once;
use idem_inbox::{Clock, Event, HandlerError, Outcome, Worker, WorkerConfig};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

fn fast() -> WorkerConfig {
    WorkerConfig::default()
        .with_lease(Duration::from_secs(5))
        .with_poll(Duration::from_millis(10))
        .with_backoff(Backoff::new(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
}

/// Effects made, per event id.
#[derive(Clone, Default)]
struct Effects(Arc<Mutex<HashMap<String, u32>>>);

impl Effects {
    fn make(&self, id: &str) {
        *self.0.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    }
    fn count(&self, id: &str) -> u32 {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }
    fn total(&self) -> u32 {
        self.0.lock().unwrap().values().sum()
    }
    fn max(&self) -> u32 {
        self.0.lock().unwrap().values().copied().max().unwrap_or(0)
    }
}

/// Runs `worker` until every job in `ids` is done or dead, then shuts it
/// down and waits for it to stop.
async fn run_until_settled(worker: Worker, queue: &dyn Queue, ids: &[idem_inbox::queue::JobId]) {
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    until_settled(queue, ids).await;
    stop.send(()).unwrap();
    running.await.unwrap();
}

async fn until_settled(queue: &dyn Queue, ids: &[idem_inbox::queue::JobId]) {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let mut all = true;
        for id in ids {
            let state = queue.inspect(id).await.unwrap().unwrap().state;
            all &= matches!(state, JobState::Done | JobState::Dead);
        }
        if all {
            return;
        }
        assert!(Instant::now() < give_up, "jobs did not settle in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_makes_its_effect_once_despite_duplicates() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let mut ids = Vec::new();
    for n in 0..40 {
        for _ in 0..3 {
            let e = queue
                .enqueue(NewJob::new("test", format!("evt-{n}"), vec![n]))
                .await
                .unwrap();
            ids.push(e.id().clone());
        }
    }
    ids.dedup();
    assert_eq!(ids.len(), 40);
    let effects = Effects::default();
    let seen = effects.clone();
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        move |e: Event| {
            let seen = seen.clone();
            async move {
                seen.make(&e.id);
                Ok(())
            }
        },
    )
    .with_config(fast().with_concurrency(4));
    run_until_settled(worker, &*queue, &ids).await;
    assert_eq!(effects.total(), 40);
    assert_eq!(effects.max(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_job_replays_instead_of_repeating_its_effect() {
    // Pins the crash window between the handler's success and the queue's
    // completion: the next delivery must replay, not run again.
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let idem = Idempotent::new(MemoryStore::new());
    let effects = Effects::default();
    let seen = effects.clone();
    let handler = move |e: Event| {
        let seen = seen.clone();
        async move {
            seen.make(&e.id);
            Ok(())
        }
    };
    queue
        .enqueue(NewJob::new("gh", "delivery-1", b"{}".to_vec()))
        .await
        .unwrap();
    let crashed = queue
        .claim(1, Duration::from_millis(200))
        .await
        .unwrap()
        .remove(0);
    let event = Event::of_job(&crashed);
    handle_once(&idem, &handler, &event).await.unwrap();
    assert_eq!(effects.count("delivery-1"), 1);
    // The worker died here, holding the job; its queue lease lapses.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let worker = Worker::new(Arc::clone(&queue), idem, handler).with_config(fast());
    assert_eq!(worker.run_once(10).await.unwrap(), [Outcome::Completed]);
    assert_eq!(effects.count("delivery-1"), 1, "the effect was repeated");
    assert_eq!(
        queue.inspect(&crashed.id).await.unwrap().unwrap().state,
        JobState::Done
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_retry_then_dead_letter_with_their_history() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let id = queue
        .enqueue(NewJob::new("s", "e", Vec::new()))
        .await
        .unwrap()
        .id()
        .clone();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        move |e: Event| {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Err(HandlerError::retryable(format!(
                    "upstream 503 on attempt {}",
                    e.attempt
                )))
            }
        },
    )
    .with_config(fast().with_max_attempts(3));
    let mut outcomes = Vec::new();
    let give_up = Instant::now() + Duration::from_secs(10);
    while outcomes.len() < 3 && Instant::now() < give_up {
        outcomes.extend(worker.run_once(1).await.unwrap());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        outcomes,
        [Outcome::Retried, Outcome::Retried, Outcome::DeadLettered]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let dead = queue.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, id);
    let errors: Vec<_> = dead[0].history.iter().map(|a| a.error.as_str()).collect();
    assert_eq!(
        errors,
        [
            "upstream 503 on attempt 1",
            "upstream 503 on attempt 2",
            "upstream 503 on attempt 3"
        ]
    );
    // Requeued from the dead letters, it runs again.
    assert!(queue.requeue(&id).await.unwrap());
    assert_eq!(worker.run_once(1).await.unwrap(), [Outcome::Retried]);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_is_dead_lettered_at_once() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    queue
        .enqueue(NewJob::new("s", "e", Vec::new()))
        .await
        .unwrap();
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        |_e: Event| async { Err(HandlerError::permanent("unknown event type")) },
    )
    .with_config(fast());
    assert_eq!(worker.run_once(1).await.unwrap(), [Outcome::DeadLettered]);
    let dead = queue.dead_letters(10).await.unwrap();
    assert_eq!(dead[0].last_error.as_deref(), Some("unknown event type"));
    assert_eq!(dead[0].attempts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_from_the_handler_is_honoured() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    queue
        .enqueue(NewJob::new("s", "e", Vec::new()))
        .await
        .unwrap();
    let asked = Duration::from_millis(400);
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        move |e: Event| async move {
            if e.attempt == 1 {
                Err(HandlerError::retryable("429").with_retry_after(asked))
            } else {
                Ok(())
            }
        },
    )
    .with_config(fast());
    let began = Instant::now();
    assert_eq!(worker.run_once(1).await.unwrap(), [Outcome::Retried]);
    loop {
        let outcomes = worker.run_once(1).await.unwrap();
        if !outcomes.is_empty() {
            assert_eq!(outcomes, [Outcome::Completed]);
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the retry never came"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        began.elapsed() >= asked,
        "retried after {:?}, before the {asked:?} asked",
        began.elapsed()
    );
}

/// A queue holding one job whose holders were "killed" `times` times: each
/// claimed it with a 50 ms lease and left the lease to lapse.
async fn a_job_killed(times: u32) -> (Arc<dyn Queue>, tempfile::TempDir, idem_inbox::queue::JobId) {
    let (queue, dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let id = queue
        .enqueue(NewJob::new("s", "e", Vec::new()))
        .await
        .unwrap()
        .id()
        .clone();
    for _ in 0..times {
        let held = queue.claim(1, Duration::from_millis(50)).await.unwrap();
        assert_eq!(held.len(), 1, "the job was not due");
        tokio::time::sleep(Duration::from_millis(80)).await;
    }
    (queue, dir, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_claimed_past_its_lapses_is_dead_lettered_without_running() {
    // Three workers die holding it: the second and third claims, and the
    // worker's below, follow lapsed leases.
    let (queue, _dir, id) = a_job_killed(3).await;
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        move |_e: Event| {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        },
    )
    .with_config(fast().with_max_lapses(2));
    assert_eq!(worker.run_once(1).await.unwrap(), [Outcome::DeadLettered]);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let info = queue.inspect(&id).await.unwrap().unwrap();
    assert_eq!((info.attempts, info.lapses), (1, 3));
    assert!(info
        .last_error
        .unwrap()
        .contains("gave up after 3 lapsed leases"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_do_not_spend_the_handlers_attempts() {
    // Four kills, twice the attempts allowed: each counted as a lapse.
    let (queue, _dir, id) = a_job_killed(4).await;
    let effects = Effects::default();
    let calls = Arc::new(AtomicU32::new(0));
    let (made, counted) = (effects.clone(), Arc::clone(&calls));
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        move |e: Event| {
            let (made, counted) = (made.clone(), Arc::clone(&counted));
            async move {
                // The handler's own failure spends the first attempt.
                if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(HandlerError::retryable("upstream down"));
                }
                made.make(&e.id);
                Ok(())
            }
        },
    )
    .with_config(fast().with_max_attempts(2));
    let mut outcomes = Vec::new();
    let give_up = Instant::now() + Duration::from_secs(10);
    while !outcomes.contains(&Outcome::Completed) {
        assert!(Instant::now() < give_up, "outcomes so far: {outcomes:?}");
        outcomes.extend(worker.run_once(1).await.unwrap());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(outcomes, [Outcome::Retried, Outcome::Completed]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(effects.count("e"), 1);
    let info = queue.inspect(&id).await.unwrap().unwrap();
    assert_eq!(
        (info.state, info.attempts, info.lapses),
        (JobState::Done, 2, 4)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_bounded_and_used() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let mut ids = Vec::new();
    for n in 0..24 {
        ids.push(
            queue
                .enqueue(NewJob::new("s", n.to_string(), Vec::new()))
                .await
                .unwrap()
                .id()
                .clone(),
        );
    }
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (r, p) = (Arc::clone(&running), Arc::clone(&peak));
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        move |_e: Event| {
            let (r, p) = (Arc::clone(&r), Arc::clone(&p));
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        },
    )
    .with_config(fast().with_concurrency(3));
    run_until_settled(worker, &*queue, &ids).await;
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "concurrency was not bounded at, or did not reach, 3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_quick_jobs_and_releases_stuck_ones() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let quick = queue
        .enqueue(NewJob::new("s", "quick", Vec::new()))
        .await
        .unwrap()
        .id()
        .clone();
    let stuck = queue
        .enqueue(NewJob::new("s", "stuck", Vec::new()))
        .await
        .unwrap()
        .id()
        .clone();
    let started = Arc::new(AtomicUsize::new(0));
    let release_quick = Arc::new(Notify::new());
    let (s, rq) = (Arc::clone(&started), Arc::clone(&release_quick));
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        move |e: Event| {
            let (s, rq) = (Arc::clone(&s), Arc::clone(&rq));
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                if e.id == "quick" {
                    rq.notified().await;
                    Ok(())
                } else {
                    std::future::pending().await
                }
            }
        },
    )
    .with_config(
        fast()
            .with_concurrency(2)
            .with_grace(Duration::from_millis(300)),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    let give_up = Instant::now() + Duration::from_secs(5);
    while started.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < give_up, "the jobs never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.send(()).unwrap();
    release_quick.notify_one();
    task.await.unwrap();
    assert_eq!(
        queue.inspect(&quick).await.unwrap().unwrap().state,
        JobState::Done
    );
    let stuck = queue.inspect(&stuck).await.unwrap().unwrap();
    assert_eq!(
        stuck.state,
        JobState::Pending,
        "the stuck job was not released"
    );
    assert_eq!(stuck.attempts, 0, "a released job counted an attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_id_with_another_payload_is_dead_lettered_not_replayed() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let idem = Idempotent::new(MemoryStore::new());
    let handler = |_e: Event| async { Ok(()) };
    let first = Event::new("s", "e", b"one".to_vec());
    handle_once(&idem, &handler, &first).await.unwrap();
    queue
        .enqueue(NewJob::new("s", "e", b"two".to_vec()))
        .await
        .unwrap();
    let worker = Worker::new(Arc::clone(&queue), idem, handler).with_config(fast());
    assert_eq!(worker.run_once(1).await.unwrap(), [Outcome::DeadLettered]);
}

#[test]
fn event_keys_are_valid_idem_keys_and_distinct() {
    use idem_inbox::worker::event_key;
    assert_eq!(event_key("evt_123"), "evt_123");
    let odd = event_key("évènement 1");
    assert!(odd.starts_with("sha256:"));
    assert!(idem_core::Key::validate_client_key(&odd).is_ok());
    assert_ne!(
        event_key("sha256:abc"),
        "sha256:abc",
        "a hashed form could be forged"
    );
    assert!(idem_core::Key::validate_client_key(&event_key(&"x".repeat(300))).is_ok());
    assert!(idem_core::Key::validate_client_key(&event_key("")).is_ok());
}

#[test]
fn backoff_is_full_jitter_under_a_doubling_ceiling_and_a_cap() {
    let b = Backoff::default();
    assert_eq!(b.ceiling(1), Duration::from_secs(120));
    assert_eq!(b.ceiling(3), Duration::from_secs(480));
    assert_eq!(b.ceiling(20), Duration::from_secs(6 * 3600));
    assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(6 * 3600));
    let delays: Vec<_> = (0..500).map(|_| b.delay(2)).collect();
    assert!(delays.iter().all(|d| *d <= Duration::from_secs(240)));
    // Full jitter: spread over the whole range, not clustered at the top.
    assert!(delays.iter().any(|d| *d < Duration::from_secs(60)));
    assert!(delays.iter().any(|d| *d > Duration::from_secs(180)));
    assert_eq!(
        Backoff::new(Duration::ZERO, Duration::ZERO).delay(5),
        Duration::ZERO
    );
}

/// A handler that runs three leases long is kept by its heartbeats. The
/// queue reads a clock the test moves, a third of a lease at a time and
/// only once a heartbeat renewed the lease since the last move: the lease
/// would have lapsed twice over without heartbeats, and cannot lapse with
/// them however slowly a loaded machine runs the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_running_past_its_lease_is_kept_by_heartbeats() {
    let lease = Duration::from_millis(300);
    let (inner, _dir) = support::sqlite_queue().await;
    let now = Arc::new(AtomicI64::new(1_800_000_000_000));
    let read = Arc::clone(&now);
    let queue = Arc::new(Counting::new(
        inner.with_clock(Clock::from_millis_fn(move || read.load(Ordering::SeqCst))),
    ));
    let id = queue
        .enqueue(NewJob::new("s", "slow", Vec::new()))
        .await
        .unwrap()
        .id()
        .clone();
    let runs = Arc::new(AtomicU32::new(0));
    let finish = Arc::new(Notify::new());
    // idem's own lease is not under test: it is left at its default.
    let idem = Idempotent::new(MemoryStore::new());
    let mut tasks = Vec::new();
    let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
    for _ in 0..2 {
        let (counted, finish) = (Arc::clone(&runs), Arc::clone(&finish));
        let queue: Arc<dyn Queue> = Arc::clone(&queue) as Arc<dyn Queue>;
        let worker = Worker::new(queue, idem.clone(), move |_e: Event| {
            let (counted, finish) = (Arc::clone(&counted), Arc::clone(&finish));
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                finish.notified().await;
                Ok(())
            }
        })
        .with_config(fast().with_lease(lease));
        let mut stopped = stop.subscribe();
        tasks.push(tokio::spawn(async move {
            worker
                .run(async move {
                    let _ = stopped.recv().await;
                })
                .await
        }));
    }
    let third = i64::try_from(lease.as_millis() / 3).unwrap();
    for _ in 0..9 {
        let seen = queue.beats.load(Ordering::SeqCst);
        let give_up = Instant::now() + Duration::from_secs(20);
        while queue.beats.load(Ordering::SeqCst) == seen {
            assert!(Instant::now() < give_up, "no heartbeat renewed the lease");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        now.fetch_add(third, Ordering::SeqCst);
    }
    finish.notify_one();
    until_settled(&*queue, std::slice::from_ref(&id)).await;
    stop.send(()).unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a heartbeating job was run twice"
    );
    assert_eq!(queue.claims.load(Ordering::SeqCst), 1, "the lease lapsed");
    let info = queue.inspect(&id).await.unwrap().unwrap();
    assert_eq!(
        (info.state, info.attempts, info.lapses),
        (JobState::Done, 1, 0)
    );
}

/// A SQLite queue that counts the claims that brought jobs back, and the
/// heartbeats that renewed a lease.
#[derive(Debug)]
struct Counting {
    inner: idem_inbox::queue::SqliteQueue,
    claims: AtomicUsize,
    claimed: AtomicUsize,
    beats: AtomicUsize,
}

impl Counting {
    fn new(inner: idem_inbox::queue::SqliteQueue) -> Counting {
        Counting {
            inner,
            claims: AtomicUsize::new(0),
            claimed: AtomicUsize::new(0),
            beats: AtomicUsize::new(0),
        }
    }
}

#[async_trait::async_trait]
impl Queue for Counting {
    async fn enqueue(
        &self,
        job: NewJob,
    ) -> Result<idem_inbox::queue::Enqueued, idem_inbox::queue::QueueError> {
        self.inner.enqueue(job).await
    }
    async fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<idem_inbox::queue::Job>, idem_inbox::queue::QueueError> {
        let jobs = self.inner.claim(max, lease).await?;
        if !jobs.is_empty() {
            self.claims.fetch_add(1, Ordering::SeqCst);
            self.claimed.fetch_add(jobs.len(), Ordering::SeqCst);
        }
        Ok(jobs)
    }
    async fn heartbeat(
        &self,
        job: &idem_inbox::queue::Job,
        lease: Duration,
    ) -> Result<idem_inbox::queue::Settle, idem_inbox::queue::QueueError> {
        let settle = self.inner.heartbeat(job, lease).await?;
        if settle.is_applied() {
            self.beats.fetch_add(1, Ordering::SeqCst);
        }
        Ok(settle)
    }
    async fn complete(
        &self,
        job: &idem_inbox::queue::Job,
    ) -> Result<idem_inbox::queue::Settle, idem_inbox::queue::QueueError> {
        self.inner.complete(job).await
    }
    async fn complete_many(
        &self,
        jobs: &[idem_inbox::queue::Job],
    ) -> Result<Vec<idem_inbox::queue::Settle>, idem_inbox::queue::QueueError> {
        self.inner.complete_many(jobs).await
    }
    async fn retry(
        &self,
        job: &idem_inbox::queue::Job,
        delay: Duration,
        error: &str,
    ) -> Result<idem_inbox::queue::Settle, idem_inbox::queue::QueueError> {
        self.inner.retry(job, delay, error).await
    }
    async fn release(
        &self,
        job: &idem_inbox::queue::Job,
    ) -> Result<idem_inbox::queue::Settle, idem_inbox::queue::QueueError> {
        self.inner.release(job).await
    }
    async fn dead_letter(
        &self,
        job: &idem_inbox::queue::Job,
        error: &str,
    ) -> Result<idem_inbox::queue::Settle, idem_inbox::queue::QueueError> {
        self.inner.dead_letter(job, error).await
    }
    async fn dead_letters(
        &self,
        limit: usize,
    ) -> Result<Vec<idem_inbox::queue::JobInfo>, idem_inbox::queue::QueueError> {
        self.inner.dead_letters(limit).await
    }
    async fn inspect(
        &self,
        id: &idem_inbox::queue::JobId,
    ) -> Result<Option<idem_inbox::queue::JobInfo>, idem_inbox::queue::QueueError> {
        self.inner.inspect(id).await
    }
    async fn requeue(
        &self,
        id: &idem_inbox::queue::JobId,
    ) -> Result<bool, idem_inbox::queue::QueueError> {
        self.inner.requeue(id).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<u64, idem_inbox::queue::QueueError> {
        self.inner.purge_expired(limit).await
    }
}

/// With prefetch, a worker whose handlers are all busy claims once half
/// its prefetch has drained, not one job each time a job ends: claims come
/// in batches while every handler stays busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefetching_worker_claims_in_batches_and_keeps_its_handlers_busy() {
    let (inner, _dir) = support::sqlite_queue().await;
    let queue = Arc::new(Counting::new(inner));
    let jobs = 120;
    let mut ids = Vec::new();
    for n in 0..jobs {
        let enqueued = queue
            .enqueue(NewJob::new("s", n.to_string(), Vec::new()))
            .await
            .unwrap();
        ids.push(enqueued.id().clone());
    }
    let effects = Effects::default();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (e, r, p) = (effects.clone(), Arc::clone(&running), Arc::clone(&peak));
    let worker = Worker::new(
        Arc::clone(&queue) as Arc<dyn Queue>,
        Idempotent::new(MemoryStore::new()),
        move |event: Event| {
            let (e, r, p) = (e.clone(), Arc::clone(&r), Arc::clone(&p));
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                e.make(&event.id);
                r.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        },
    )
    .with_config(fast().with_concurrency(4).with_prefetch(8));
    run_until_settled(worker, &*queue, &ids).await;
    assert_eq!(effects.total(), jobs);
    assert_eq!(effects.max(), 1);
    assert_eq!(
        peak.load(Ordering::SeqCst),
        4,
        "the handlers were not all kept busy"
    );
    let (claims, claimed) = (
        queue.claims.load(Ordering::SeqCst),
        queue.claimed.load(Ordering::SeqCst),
    );
    assert_eq!(claimed, jobs as usize);
    // One job per claim as each job ends would be about 110 claims here;
    // batches of half the prefetch, about 30.
    assert!(
        claims <= jobs as usize / 3,
        "{claims} claims for {claimed} jobs: the worker claims one job at a time"
    );
}
