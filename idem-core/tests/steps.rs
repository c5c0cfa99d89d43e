//! Durable steps on the reference store: each test counts how often every
//! step's work ran, across crashes (dropped futures), takeovers and
//! replays. Time is tokio's paused clock, which `MemoryStore` reads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::AtomicBool;

use idem_core::store::{Insert, NewRecord, Record, State, Store, StoreError, Token};
use idem_core::{Error, Idempotent, MemoryStore, Steps, StepsError};
use tokio::time::Instant;

const LEASE: Duration = Duration::from_millis(300);

fn idem() -> Idempotent {
    Idempotent::new(MemoryStore::new()).with_lease(LEASE)
}

/// How many times each of three steps ran.
#[derive(Default, Clone)]
struct Counts(Arc<[AtomicUsize; 3]>);

impl Counts {
    fn bump(&self, i: usize) {
        self.0[i].fetch_add(1, Ordering::SeqCst);
    }
    fn get(&self) -> [usize; 3] {
        [0, 1, 2].map(|i| self.0[i].load(Ordering::SeqCst))
    }
}

/// Where a run stops as if its process were killed.
#[derive(Clone, Copy, PartialEq)]
enum Crash {
    Never,
    /// Inside step `i`, after its effect, before its record.
    Inside(usize),
    /// After step `i` was recorded, before the next starts.
    After(usize),
}

/// Three steps named `a`, `b`, `c`; returns the sum of their outcomes.
async fn three_steps(steps: Steps, counts: Counts, crash: Crash) -> Result<u32, Error<String>> {
    let mut total = 0;
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let counts = counts.clone();
        total += steps
            .step(name, || async move {
                counts.bump(i);
                if crash == Crash::Inside(i) {
                    std::future::pending::<()>().await;
                }
                Ok::<u32, String>(10u32.pow(i as u32))
            })
            .await?;
        if crash == Crash::After(i) {
            std::future::pending::<()>().await;
        }
    }
    Ok(total)
}

/// Runs the three steps, "killing" the run (dropping its future) at `crash`.
async fn run(
    idem: &Idempotent,
    key: &str,
    counts: &Counts,
    crash: Crash,
) -> Option<Result<u32, Error<String>>> {
    let counts = counts.clone();
    let call = idem.execute_steps(key, "body", move |steps| three_steps(steps, counts, crash));
    let done = tokio::time::timeout(LEASE * 2, call).await.ok();
    if done.is_none() {
        // The run was killed: its lease lapses one lease length later.
        tokio::time::sleep(LEASE).await;
    }
    done
}

#[tokio::test(start_paused = true)]
async fn a_first_run_runs_each_step_once_and_a_retry_replays_without_running() {
    let idem = idem();
    let counts = Counts::default();
    assert_eq!(
        run(&idem, "k", &counts, Crash::Never)
            .await
            .unwrap()
            .unwrap(),
        111
    );
    assert_eq!(
        run(&idem, "k", &counts, Crash::Never)
            .await
            .unwrap()
            .unwrap(),
        111
    );
    assert_eq!(counts.get(), [1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_crash_at_any_boundary_resumes_after_the_last_recorded_step() {
    for i in 0..3 {
        let idem = idem();
        let counts = Counts::default();
        assert!(
            run(&idem, "k", &counts, Crash::After(i)).await.is_none(),
            "the run was not killed"
        );
        // The lease lapsed while the "killed" run hung; a retry takes over.
        assert_eq!(
            run(&idem, "k", &counts, Crash::Never)
                .await
                .unwrap()
                .unwrap(),
            111
        );
        assert_eq!(counts.get(), [1, 1, 1], "crash after step {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_crash_inside_a_step_runs_that_step_again_and_no_other() {
    for i in 0..3 {
        let idem = idem();
        let counts = Counts::default();
        assert!(run(&idem, "k", &counts, Crash::Inside(i)).await.is_none());
        assert_eq!(
            run(&idem, "k", &counts, Crash::Never)
                .await
                .unwrap()
                .unwrap(),
            111
        );
        let mut expected = [1, 1, 1];
        expected[i] = 2;
        assert_eq!(counts.get(), expected, "crash inside step {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_long_step_keeps_the_lease_and_the_journal_through_renewals() {
    // Renewals rewrite the payload; a renewal that forgot the journal would
    // make the resume below run step `a` again.
    let idem = idem();
    let counts = Counts::default();
    let c = counts.clone();
    let call = idem.execute_steps("k", "body", move |steps| async move {
        steps
            .step("a", || async {
                c.bump(0);
                Ok::<_, String>(1u32)
            })
            .await?;
        tokio::time::sleep(LEASE * 5).await; // many heartbeats
        std::future::pending::<()>().await;
        Ok::<u32, Error<String>>(0)
    });
    assert!(tokio::time::timeout(LEASE * 6, call).await.is_err());
    tokio::time::sleep(LEASE).await;
    assert_eq!(
        run(&idem, "k", &counts, Crash::Never)
            .await
            .unwrap()
            .unwrap(),
        111
    );
    assert_eq!(counts.get(), [1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_live_while_a_step_runs_past_its_length() {
    let idem = idem();
    let counts = Counts::default();
    let slow = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.execute_steps("k", "body", |steps| async move {
                steps
                    .step("a", || async {
                        tokio::time::sleep(LEASE * 4).await;
                        Ok::<_, String>(1u32)
                    })
                    .await
            })
            .await
        })
    };
    tokio::time::sleep(LEASE * 2).await;
    let second = run(&idem, "k", &counts, Crash::Never).await.unwrap();
    assert!(
        matches!(second, Err(Error::InProgress { .. })),
        "{second:?}"
    );
    assert_eq!(slow.await.unwrap().unwrap(), 1);
    assert_eq!(counts.get(), [0, 0, 0]);
}

/// Starts the three steps and "kills" the run once step `a` is recorded
/// (its future dropped, as in a crash), leaving the key claimed for a
/// lease; returns when the run started.
async fn crash_after_step_a(idem: &Idempotent, counts: &Counts) -> Instant {
    let started = Instant::now();
    let counts_ = counts.clone();
    let call = idem.execute_steps("k", "body", move |steps| {
        three_steps(steps, counts_, Crash::After(0))
    });
    // On the paused clock the run reaches its hang before the timeout.
    assert!(tokio::time::timeout(LEASE / 10, call).await.is_err());
    assert_eq!(counts.get(), [1, 0, 0], "the run did not hang after `a`");
    started
}

// Pins the defect where durable steps ignored `with_wait`: a retry after a
// crash got `InProgress` until the lease lapsed, and callers had to loop.
#[tokio::test(start_paused = true)]
async fn a_waiting_retry_resumes_a_crashed_run_as_soon_as_its_lease_lapses() {
    let idem = idem();
    let counts = Counts::default();
    let crashed_at = crash_after_step_a(&idem, &counts).await;
    let c = counts.clone();
    let resumed = idem
        .clone()
        .with_wait(LEASE * 4)
        .execute_steps("k", "body", move |steps| async move {
            assert_eq!(steps.takeovers().await, 1, "the resume is a takeover");
            three_steps(steps, c, Crash::Never).await
        })
        .await;
    assert_eq!(resumed.unwrap(), 111);
    let took = crashed_at.elapsed();
    assert!(took >= LEASE, "took over a live lease after {took:?}");
    assert!(
        took <= LEASE + Duration::from_millis(5),
        "resumed late: {took:?}"
    );
    // `a` was replayed from the journal, not run again.
    assert_eq!(counts.get(), [1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_retry_of_a_live_run_gets_its_outcome_replayed() {
    let idem = idem();
    let counts = Counts::default();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let owner = {
        let (idem, counts) = (idem.clone(), counts.clone());
        tokio::spawn(async move {
            idem.execute_steps("k", "body", move |steps| async move {
                let c = counts.clone();
                let a = steps
                    .step("a", || async move {
                        c.bump(0);
                        Ok::<_, String>(1u32)
                    })
                    .await?;
                started_tx.send(()).unwrap();
                // Past several lease lengths: the heartbeat keeps it live,
                // and the waiter must not take it over meanwhile.
                tokio::time::sleep(LEASE * 3).await;
                let b = steps
                    .step("b", || async move {
                        counts.bump(1);
                        Ok::<_, String>(10u32)
                    })
                    .await?;
                Ok(a + b)
            })
            .await
        })
    };
    started.await.unwrap();
    let start = Instant::now();
    let waiting = idem.clone().with_wait(LEASE * 10);
    let c = counts.clone();
    let waited = waiting
        .execute_steps("k", "body", move |steps| {
            three_steps(steps, c, Crash::Never)
        })
        .await;
    assert_eq!(waited.unwrap(), 11, "the live run's outcome, replayed");
    let took = start.elapsed();
    assert!(
        took >= LEASE * 3,
        "got the outcome before it existed: {took:?}"
    );
    // The store wakes the waiter when the outcome is recorded.
    assert!(
        took <= LEASE * 3 + Duration::from_millis(5),
        "saw the outcome late: {took:?}"
    );
    assert_eq!(owner.await.unwrap().unwrap(), 11);
    assert_eq!(counts.get(), [1, 1, 0], "no step ran twice");
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_does_not_wait_gets_in_progress_at_once_and_a_mismatch_always_does() {
    let idem = idem();
    let counts = Counts::default();
    crash_after_step_a(&idem, &counts).await;
    let start = Instant::now();
    let c = counts.clone();
    let refused = idem
        .execute_steps("k", "body", move |steps| {
            three_steps(steps, c, Crash::Never)
        })
        .await;
    match refused {
        Err(Error::InProgress { retry_after }) => {
            assert!(
                retry_after > Duration::ZERO && retry_after <= LEASE,
                "{retry_after:?}"
            )
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "did not answer at once");
    // The fingerprint is checked before the lease, even by a waiter.
    let c = counts.clone();
    let other_body = idem
        .clone()
        .with_wait(LEASE * 4)
        .execute_steps("k", "other body", move |steps| {
            three_steps(steps, c, Crash::Never)
        })
        .await;
    assert!(matches!(other_body, Err(Error::Mismatch)), "{other_body:?}");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "waited to refuse a mismatch"
    );
    assert_eq!(counts.get(), [1, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_wait_ends_before_the_lease_gets_in_progress_at_its_deadline() {
    let idem = idem();
    let counts = Counts::default();
    crash_after_step_a(&idem, &counts).await;
    let start = Instant::now();
    let wait = LEASE / 3;
    let c = counts.clone();
    let waited = idem
        .clone()
        .with_wait(wait)
        .execute_steps("k", "body", move |steps| {
            three_steps(steps, c, Crash::Never)
        })
        .await;
    assert!(
        matches!(waited, Err(Error::InProgress { .. })),
        "{waited:?}"
    );
    assert_eq!(start.elapsed(), wait, "gave up off its deadline");
    assert_eq!(counts.get(), [1, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_waiters_takeover_counts_toward_the_takeover_limit() {
    let idem = idem();
    let counts = Counts::default();
    crash_after_step_a(&idem, &counts).await;
    let c = counts.clone();
    let settled = idem
        .clone()
        .with_wait(LEASE * 4)
        .durable()
        .with_max_takeovers(0)
        .execute("k", "body", move |steps| {
            three_steps(steps, c, Crash::Never)
        })
        .await;
    match settled {
        Err(Error::Steps(StepsError::Poisoned(p))) => assert_eq!(p.takeovers, 1),
        other => panic!("expected Poisoned, got {other:?}"),
    }
    assert_eq!(counts.get(), [1, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_resumed_run_with_other_steps_fails_with_a_typed_error() {
    let idem = idem();
    let counts = Counts::default();
    assert!(run(&idem, "k", &counts, Crash::After(1)).await.is_none());
    let renamed = idem
        .execute_steps("k", "body", |steps| async move {
            steps.step("a", || async { Ok::<_, String>(1u32) }).await?;
            steps
                .step("b-renamed", || async { Ok::<_, String>(1u32) })
                .await
        })
        .await;
    match renamed {
        Err(Error::Steps(StepsError::Diverged {
            position,
            recorded,
            requested,
        })) => {
            assert_eq!((position, recorded.as_str()), (1, "b"));
            assert_eq!(requested.as_deref(), Some("b-renamed"));
        }
        other => panic!("expected Diverged, got {other:?}"),
    }
    // A run that ends before the recorded steps diverges too.
    let shorter = idem
        .execute_steps("k", "body", |steps| async move {
            steps.step("a", || async { Ok::<_, String>(1u32) }).await
        })
        .await;
    assert!(
        matches!(
            &shorter,
            Err(Error::Steps(StepsError::Diverged {
                position: 1,
                requested: None,
                ..
            }))
        ),
        "{shorter:?}"
    );
    // The journal is kept: the original code resumes at once.
    assert_eq!(
        run(&idem, "k", &counts, Crash::Never)
            .await
            .unwrap()
            .unwrap(),
        111
    );
    assert_eq!(counts.get(), [1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_step_hands_the_key_over_and_a_retry_resumes_at_once() {
    let idem = idem();
    let counts = Counts::default();
    let c = counts.clone();
    let failed = idem
        .execute_steps("k", "body", move |steps| async move {
            steps
                .step("a", || async {
                    c.bump(0);
                    Ok::<_, String>(1u32)
                })
                .await?;
            steps
                .step("b", || async { Err::<u32, _>("gateway down".to_owned()) })
                .await
        })
        .await;
    assert!(
        matches!(&failed, Err(Error::Work(e)) if e == "gateway down"),
        "{failed:?}"
    );
    // No waiting for a lease: the retry takes over at once and resumes.
    let c = counts.clone();
    let resumed = idem
        .execute_steps("k", "body", move |steps| async move {
            let a = steps
                .step("a", || async {
                    c.bump(0);
                    Ok::<_, String>(1u32)
                })
                .await?;
            assert_eq!(
                steps.takeovers().await,
                0,
                "a hand-over counted as a takeover"
            );
            let b = steps.step("b", || async { Ok::<_, String>(2u32) }).await?;
            Ok(a + b)
        })
        .await;
    assert_eq!(resumed.unwrap(), 3);
    assert_eq!(counts.get()[0], 1);
}

#[tokio::test(start_paused = true)]
async fn a_key_taken_over_too_often_is_settled_as_failed_with_its_history() {
    let idem = idem();
    let counts = Counts::default();
    let durable = idem.durable().with_max_takeovers(2);
    let mut crashes = 0;
    let poisoned = loop {
        let c = counts.clone();
        let call = durable.execute("k", "body", move |steps| async move {
            steps
                .step("a", || async {
                    c.bump(0);
                    Ok::<_, String>(1u32)
                })
                .await?;
            std::future::pending::<()>().await; // the poison: dies every time
            Ok::<u32, Error<String>>(0)
        });
        match tokio::time::timeout(LEASE * 2, call).await {
            Err(_) => {
                crashes += 1;
                tokio::time::sleep(LEASE).await;
            }
            Ok(result) => break result,
        }
        assert!(crashes <= 3, "never settled");
    };
    // The first run and two takeovers died; the third takeover settles.
    assert_eq!(crashes, 3);
    let expected = idem_core::steps::Poisoned {
        takeovers: 3,
        steps: vec!["a".to_owned()],
    };
    match poisoned {
        Err(Error::Steps(StepsError::Poisoned(p))) => assert_eq!(p, expected),
        other => panic!("expected Poisoned, got {other:?}"),
    }
    assert_eq!(counts.get()[0], 1);
    // Every later call gets the same answer from the store, without running.
    let again = run(&idem, "k", &counts, Crash::Never).await.unwrap();
    assert!(matches!(again, Err(Error::Steps(StepsError::Poisoned(p))) if p == expected));
    assert_eq!(counts.get(), [1, 0, 0]);
}

/// The real store, with its swaps cut while `cut` is set: an owner cut off
/// from the store (a partition) whose renewals fail.
#[derive(Debug)]
struct Partitioned {
    inner: Arc<MemoryStore>,
    cut: AtomicBool,
}

#[async_trait::async_trait]
impl Store for Partitioned {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        self.inner.insert(key, record).await
    }
    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(StoreError::backend("partitioned", "cut off"));
        }
        self.inner.swap(key, expected, record).await
    }
    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.take_over(key, expected, record).await
    }
    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        self.inner.remove(key, expected).await
    }
    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.load(key).await
    }
    async fn reset(&self, key: &str) -> Result<idem_core::store::Reset, StoreError> {
        self.inner.reset(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_stale_owner_cannot_record_a_step_after_a_takeover() {
    let inner = Arc::new(MemoryStore::new());
    let cut_off = Arc::new(Partitioned {
        inner: inner.clone(),
        cut: AtomicBool::new(false),
    });
    let stale_idem = Idempotent::from_arc(cut_off.clone()).with_lease(LEASE);
    let idem = Idempotent::from_arc(inner).with_lease(LEASE);
    let counts = Counts::default();
    let (lapsed_tx, lapsed_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let stale = {
        let counts = counts.clone();
        tokio::spawn(async move {
            stale_idem
                .execute_steps("k", "body", move |steps| async move {
                    let c = counts.clone();
                    steps
                        .step("a", || async move {
                            c.bump(0);
                            Ok::<_, String>(1u32)
                        })
                        .await?;
                    steps
                        .step("b", || async move {
                            counts.bump(1);
                            cut_off.cut.store(true, Ordering::SeqCst);
                            tokio::time::sleep(LEASE * 2).await; // renewals fail meanwhile
                            lapsed_tx.send(()).unwrap();
                            go_rx.await.unwrap();
                            cut_off.cut.store(false, Ordering::SeqCst);
                            Ok::<_, String>(999u32)
                        })
                        .await
                })
                .await
        })
    };
    lapsed_rx.await.unwrap();
    // The lease lapsed: a retry takes over, replays `a`, runs `b` and `c`.
    assert_eq!(
        run(&idem, "k", &counts, Crash::Never)
            .await
            .unwrap()
            .unwrap(),
        111
    );
    go_tx.send(()).unwrap();
    let stale = stale.await.unwrap();
    assert!(matches!(stale, Err(Error::LeaseLost)), "{stale:?}");
    assert_eq!(counts.get(), [1, 2, 1]);
    // The stale owner's step changed nothing: the recorded outcome stands.
    assert_eq!(
        run(&idem, "k", &counts, Crash::Never)
            .await
            .unwrap()
            .unwrap(),
        111
    );
    assert_eq!(counts.get(), [1, 2, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_step_recorded_after_a_read_makes_a_takeover_from_that_read_fail() {
    // Pins the read-then-take-over race: the token rotates at every
    // recorded step, so a taker-over that read the journal before a step
    // was recorded cannot take over with that stale journal.
    let store = Arc::new(MemoryStore::new());
    let idem = Idempotent::from_arc(store.clone()).with_lease(LEASE);
    let key = idem.key("k").unwrap();
    let (read_tx, read_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let owner = {
        let idem = idem.clone();
        let store = store.clone();
        let key = key.clone();
        tokio::spawn(async move {
            idem.execute_steps("k", "body", move |steps| async move {
                steps.step("a", || async { Ok::<_, String>(1u32) }).await?;
                // A would-be taker-over reads the record now...
                let read = store.load(key.as_str()).await.unwrap().unwrap();
                read_tx.send(read).unwrap();
                go_rx.await.unwrap();
                // ...and the owner records another step before it acts.
                steps.step("b", || async { Ok::<_, String>(2u32) }).await
            })
            .await
        })
    };
    let read = read_rx.await.unwrap();
    assert_eq!(read.state, State::InFlight);
    go_tx.send(()).unwrap();
    assert_eq!(owner.await.unwrap().unwrap(), 2);
    let rec = store.load(key.as_str()).await.unwrap().unwrap();
    assert_eq!(rec.state, State::Completed);
    // The token the reader saw is gone: no swap or takeover can match it.
    assert_ne!(rec.token, read.token);
}

#[tokio::test(start_paused = true)]
async fn a_remote_step_gets_the_same_derived_key_after_a_takeover() {
    let idem = idem();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    for crash in [true, false] {
        let seen = Arc::clone(&seen);
        let call = idem.execute_steps("k", "body", move |steps| async move {
            let key = steps.derive_key("email");
            assert_eq!(
                key,
                idem_core::Key::derive(&[steps.key().as_str(), "email"])
            );
            steps
                .remote("email", |derived| async move {
                    seen.lock().unwrap().push(derived);
                    if crash {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, String>(1u32)
                })
                .await
        });
        let _ = tokio::time::timeout(LEASE * 2, call).await;
        tokio::time::sleep(LEASE).await;
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], seen[1]);
}

/// The orchestrator of the weekly-report agent (`examples/weekly_report.rs`)
/// killed at every step boundary and inside the email call: one email,
/// the summary paid for once, every re-run finishing.
#[tokio::test(start_paused = true)]
async fn the_weekly_report_agent_killed_anywhere_sends_one_email_and_pays_once() {
    #[derive(Default)]
    struct Tools {
        fetched: AtomicUsize,
        paid: AtomicUsize,
        outbox: std::sync::Mutex<std::collections::HashSet<String>>,
    }
    for kill_at in [
        "after-fetch",
        "after-summary",
        "inside-email",
        "after-email",
    ] {
        let idem = idem();
        let tools = Arc::new(Tools::default());
        let key = idem_core::Key::derive(&["report-118", "2026-11-30"]);
        for kill in [true, false] {
            let tools = Arc::clone(&tools);
            let at = move |here: &str| kill && here == kill_at;
            let call = idem.execute_steps(&key, "report-118", move |steps| async move {
                let t = Arc::clone(&tools);
                let sales: Vec<u32> = steps
                    .step("fetch-sales", || async move {
                        t.fetched.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, String>(vec![120, 95])
                    })
                    .await?;
                if at("after-fetch") {
                    std::future::pending::<()>().await;
                }
                let t = Arc::clone(&tools);
                let summary: String = steps
                    .step("write-summary", || async move {
                        t.paid.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, String>(format!("{} units", sales.iter().sum::<u32>()))
                    })
                    .await?;
                if at("after-summary") {
                    std::future::pending::<()>().await;
                }
                let t = Arc::clone(&tools);
                let sent: bool = steps
                    .remote("email-bob", |derived| async move {
                        let fresh = t.outbox.lock().unwrap().insert(derived);
                        if at("inside-email") {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, String>(fresh)
                    })
                    .await?;
                if at("after-email") {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Error<String>>(format!("{summary} sent={sent}"))
            });
            match tokio::time::timeout(LEASE * 2, call).await {
                Err(_) => {
                    assert!(kill, "the re-run hung ({kill_at})");
                    tokio::time::sleep(LEASE).await;
                }
                Ok(done) => {
                    assert!(!kill, "the run was not killed at {kill_at}");
                    done.unwrap_or_else(|e| panic!("the re-run failed ({kill_at}): {e}"));
                }
            }
        }
        let counts = (
            tools.fetched.load(Ordering::SeqCst),
            tools.paid.load(Ordering::SeqCst),
            tools.outbox.lock().unwrap().len(),
        );
        assert_eq!(counts, (1, 1, 1), "killed {kill_at}");
    }
}
