//! Generated interleavings: enqueuers racing with duplicates, workers that
//! complete, crash, stall past their lease and finish late, retry and
//! release — checked against the queue's invariants.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use tokio::time::Instant;

use super::super::support::{source, POLL};
use super::super::QueueFactory;
use crate::queue::{Enqueued, Job, JobId, JobState, NewJob, Queue, Settle, Token};

/// Schedules per run when `PROPTEST_CASES` is not set.
const DEFAULT_CASES: u32 = 8;

/// The lease workers take: short, so stalls and crashes cost little time.
const LEASE: Duration = Duration::from_millis(400);

/// How long a schedule may take to settle every event before the rest
/// count as lost.
const DEADLINE: Duration = Duration::from_secs(30);

/// What a worker does with one claimed job.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    /// Works for a while, then completes.
    Complete { work_ms: u8 },
    /// Works past its lease, heartbeating, then completes.
    LongWork,
    /// Dies holding the job: never settles it.
    Crash,
    /// Stalls past its lease, then tries to complete late.
    Stall,
    /// Fails and asks for a retry at once.
    Retry,
    /// Gives the job back unrun.
    Release,
}

#[derive(Debug, Clone)]
struct Schedule {
    /// Per enqueuer: (event number, pause before it in ms).
    enqueuers: Vec<Vec<(u8, u8)>>,
    /// Per worker: batch size and the behaviours it cycles through for its
    /// first jobs (after them, it completes everything).
    workers: Vec<(usize, Vec<Behaviour>)>,
}

fn behaviour() -> impl Strategy<Value = Behaviour> {
    prop_oneof![
        3 => (0u8..200).prop_map(|work_ms| Behaviour::Complete { work_ms }),
        1 => Just(Behaviour::LongWork),
        2 => Just(Behaviour::Crash),
        2 => Just(Behaviour::Stall),
        2 => Just(Behaviour::Retry),
        1 => Just(Behaviour::Release),
    ]
}

fn schedules() -> impl Strategy<Value = Schedule> {
    (
        prop::collection::vec(prop::collection::vec((0u8..12, 0u8..15), 1..8), 1..4),
        prop::collection::vec((1usize..4, prop::collection::vec(behaviour(), 0..6)), 2..4),
    )
        .prop_map(|(enqueuers, workers)| Schedule { enqueuers, workers })
}

/// What the run observed, in the order calls returned.
#[derive(Default)]
struct Ledger {
    /// Per job, the tokens of its claims in the order they returned.
    claims: HashMap<JobId, Vec<Token>>,
    /// Per event, the job it became.
    jobs: HashMap<String, JobId>,
    /// Per event, how many enqueues reported it new.
    new: HashMap<String, u32>,
    /// Jobs whose completion applied.
    completed: HashSet<JobId>,
    violations: Vec<String>,
}

/// Generated schedules of 1–3 enqueuers (with duplicate events) and 2–3
/// workers that complete, work past their lease with heartbeats, crash,
/// stall and finish late, retry and release keep every invariant: each
/// event is queued once, completed exactly once, and none is lost; a claim
/// never returns a completed job; and no settle applies once another claim
/// of the job has returned.
///
/// `PROPTEST_CASES` sets the number of schedules (default 8);
/// `PROPTEST_RNG_SEED` replays a run.
pub async fn generated_schedules_lose_nothing_and_fence_every_late_worker(
    factory: &dyn QueueFactory,
) {
    let seed = env("PROPTEST_RNG_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let cases = env("PROPTEST_CASES").map_or(DEFAULT_CASES, |n| n as u32);
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = schedules();
    let drawn: Vec<Schedule> = (0..cases)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .unwrap_or_else(|e| panic!("cannot generate a schedule: {e}"))
                .current()
        })
        .collect();
    drop(runner);
    for (n, schedule) in drawn.iter().enumerate() {
        let violations = play(factory, schedule).await;
        assert!(
            violations.is_empty(),
            "schedule {n} of {cases} broke the queue's invariants (rerun with PROPTEST_RNG_SEED={seed}):\n  - {}\nschedule: {schedule:#?}",
            violations.join("\n  - ")
        );
    }
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

async fn play(factory: &dyn QueueFactory, schedule: &Schedule) -> Vec<String> {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("interleaving");
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let stop = Arc::new(AtomicBool::new(false));

    let mut workers = Vec::new();
    for (batch, script) in schedule.workers.clone() {
        let (queue, ledger, stop) = (Arc::clone(&queue), Arc::clone(&ledger), Arc::clone(&stop));
        workers.push(tokio::spawn(work(queue, ledger, stop, batch, script)));
    }
    let mut enqueuers = Vec::new();
    for plan in schedule.enqueuers.clone() {
        let (queue, ledger, src) = (Arc::clone(&queue), Arc::clone(&ledger), src.clone());
        enqueuers.push(tokio::spawn(async move {
            for (event, pause) in plan {
                tokio::time::sleep(Duration::from_millis(pause.into())).await;
                let event = format!("e{event}");
                let outcome = queue
                    .enqueue(NewJob::new(&src, &event, event.clone().into_bytes()))
                    .await;
                let mut l = ledger.lock().unwrap();
                match outcome {
                    Ok(enqueued) => {
                        if let Enqueued::New(_) = enqueued {
                            *l.new.entry(event.clone()).or_default() += 1;
                        }
                        let id = enqueued.id().clone();
                        if let Some(known) = l.jobs.insert(event.clone(), id.clone()) {
                            if known != id {
                                l.violations
                                    .push(format!("{event} became two jobs: {known} and {id}"));
                            }
                        }
                    }
                    Err(e) => l.violations.push(format!("enqueue of {event} failed: {e}")),
                }
            }
        }));
    }
    for enqueuer in enqueuers {
        enqueuer.await.expect("an enqueuer panicked");
    }

    let events: HashSet<String> = schedule
        .enqueuers
        .iter()
        .flatten()
        .map(|(e, _)| format!("e{e}"))
        .collect();
    let give_up = Instant::now() + DEADLINE;
    loop {
        let all_done = {
            let l = ledger.lock().unwrap();
            events
                .iter()
                .all(|e| l.jobs.get(e).is_some_and(|id| l.completed.contains(id)))
        };
        if all_done || Instant::now() > give_up {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        // A stalled worker may still be asleep; it settles nothing that
        // matters any more, so it is not waited for past its stall.
        let _ = tokio::time::timeout(LEASE * 3, worker).await;
    }

    let (mut violations, checks) = {
        let l = ledger.lock().unwrap();
        let mut violations = l.violations.clone();
        let mut checks = Vec::new();
        for event in &events {
            let Some(id) = l.jobs.get(event) else {
                violations.push(format!("{event} was never enqueued"));
                continue;
            };
            let reported_new = l.new.get(event).copied().unwrap_or(0);
            if reported_new != 1 {
                violations.push(format!("{event} was reported new {reported_new} times"));
            }
            if !l.completed.contains(id) {
                violations.push(format!(
                    "{event} (job {id}) was lost: never completed within {DEADLINE:?}"
                ));
            }
            checks.push((event.clone(), id.clone()));
        }
        (violations, checks)
    };
    for (event, id) in checks {
        match queue.inspect(&id).await {
            Ok(Some(info)) if info.state == JobState::Done => {}
            Ok(other) => violations.push(format!("{event} (job {id}) ended as {other:?}")),
            Err(e) => violations.push(format!("inspect of {id} failed: {e}")),
        }
    }
    violations
}

async fn work(
    queue: Arc<dyn Queue>,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<AtomicBool>,
    batch: usize,
    script: Vec<Behaviour>,
) {
    let mut script = script.into_iter();
    while !stop.load(Ordering::SeqCst) {
        let completed_before = ledger.lock().unwrap().completed.clone();
        let jobs = match queue.claim(batch, LEASE).await {
            Ok(jobs) => jobs,
            Err(e) => {
                ledger
                    .lock()
                    .unwrap()
                    .violations
                    .push(format!("claim failed: {e}"));
                return;
            }
        };
        if jobs.is_empty() {
            tokio::time::sleep(POLL).await;
            continue;
        }
        {
            let mut l = ledger.lock().unwrap();
            for job in &jobs {
                if completed_before.contains(&job.id) {
                    l.violations
                        .push(format!("job {} was claimed after it completed", job.id));
                }
                l.claims
                    .entry(job.id.clone())
                    .or_default()
                    .push(job.token.clone());
            }
        }
        for job in jobs {
            let behaviour = script.next().unwrap_or(Behaviour::Complete { work_ms: 20 });
            match behaviour {
                Behaviour::Complete { work_ms } => {
                    tokio::time::sleep(Duration::from_millis(work_ms.into())).await;
                    let _checked = settle(&*queue, &ledger, &job, Op::Complete).await;
                }
                Behaviour::LongWork => {
                    let until = Instant::now() + LEASE * 2;
                    let mut held = true;
                    while held && Instant::now() < until {
                        tokio::time::sleep(LEASE / 4).await;
                        held = settle(&*queue, &ledger, &job, Op::Heartbeat)
                            .await
                            .is_applied();
                    }
                    if held {
                        let _checked = settle(&*queue, &ledger, &job, Op::Complete).await;
                    }
                }
                Behaviour::Crash => {}
                Behaviour::Stall => {
                    // Wakes once an heir has claimed the job (or a while
                    // after the lease lapsed), while the heir is likely
                    // mid-work: the moment a missing fence shows.
                    tokio::time::sleep(LEASE).await;
                    let give_up = Instant::now() + LEASE;
                    while Instant::now() < give_up && !reclaimed(&ledger, &job) {
                        tokio::time::sleep(POLL / 2).await;
                    }
                    let _checked = settle(&*queue, &ledger, &job, Op::Complete).await;
                }
                Behaviour::Retry => {
                    let _checked = settle(&*queue, &ledger, &job, Op::Retry).await;
                }
                Behaviour::Release => {
                    let _checked = settle(&*queue, &ledger, &job, Op::Release).await;
                }
            }
        }
    }
}

/// Whether a claim of `job` newer than the caller's has returned.
fn reclaimed(ledger: &Mutex<Ledger>, job: &Job) -> bool {
    ledger
        .lock()
        .unwrap()
        .claims
        .get(&job.id)
        .and_then(|tokens| tokens.last())
        .is_some_and(|last| *last != job.token)
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Complete,
    Heartbeat,
    Retry,
    Release,
}

/// Runs a fenced transition and checks it against the claims that
/// returned before it began.
async fn settle(queue: &dyn Queue, ledger: &Mutex<Ledger>, job: &Job, op: Op) -> Settle {
    let last_claim = ledger
        .lock()
        .unwrap()
        .claims
        .get(&job.id)
        .and_then(|tokens| tokens.last().cloned());
    let outcome = match op {
        Op::Complete => queue.complete(job).await,
        Op::Heartbeat => queue.heartbeat(job, LEASE).await,
        Op::Retry => queue.retry(job, Duration::ZERO, "generated failure").await,
        Op::Release => queue.release(job).await,
    };
    let mut l = ledger.lock().unwrap();
    let settle = match outcome {
        Ok(settle) => settle,
        Err(e) => {
            l.violations
                .push(format!("{op:?} of job {} failed: {e}", job.id));
            return Settle::LeaseLost;
        }
    };
    if settle.is_applied() {
        if last_claim.as_ref() != Some(&job.token) {
            l.violations.push(format!(
                "{op:?} by a late worker applied to job {} after another claim of it returned",
                job.id
            ));
        }
        if let Op::Complete = op {
            if !l.completed.insert(job.id.clone()) {
                l.violations.push(format!("job {} completed twice", job.id));
            }
        }
    }
    settle
}
