//! The heartbeat of `Lease::run`: it keeps the lease while blocking work
//! runs on a multi-thread runtime, stops once the work finishes, and stops
//! at once when the run is dropped. Renewals are counted by the store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use idem_core::store::{Insert, NewRecord, Record, State, Store, StoreError, Token, Wakeups};
use idem_core::{Begin, Error, Fingerprint, Idempotent, Lease, MemoryStore};
use tokio::sync::Semaphore;

type Res<T> = Result<T, Error<String>>;

/// A `MemoryStore` that counts renewals (`swap`s to `InFlight`) when they
/// are made and when they are answered, can hold one renewal until
/// [`open`](Renewals::open) is called, and counts take-overs.
#[derive(Debug, Clone)]
struct Renewals {
    inner: Arc<MemoryStore>,
    made: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    taken_over: Arc<AtomicUsize>,
    // The renewal (counted from 1) that waits for the gate; 0 for none.
    held: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Renewals {
    fn new() -> Renewals {
        Renewals {
            inner: Arc::new(MemoryStore::new()),
            made: Arc::default(),
            answered: Arc::default(),
            taken_over: Arc::default(),
            held: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    /// Holds the `n`th renewal in the store until [`open`](Self::open).
    fn hold(self, n: usize) -> Renewals {
        self.held.store(n, Ordering::SeqCst);
        self
    }

    fn open(&self) {
        self.gate.add_permits(1);
    }

    fn made(&self) -> usize {
        self.made.load(Ordering::SeqCst)
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    fn taken_over(&self) -> usize {
        self.taken_over.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Store for Renewals {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        self.inner.insert(key, record).await
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        if record.state != State::InFlight {
            return self.inner.swap(key, expected, record).await;
        }
        let n = self.made.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.held.load(Ordering::SeqCst) {
            self.gate.acquire().await.unwrap().forget();
        }
        let answer = self.inner.swap(key, expected, record).await;
        self.answered.fetch_add(1, Ordering::SeqCst);
        answer
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let taken = self.inner.take_over(key, expected, record).await;
        if matches!(taken, Ok(true)) {
            self.taken_over.fetch_add(1, Ordering::SeqCst);
        }
        taken
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

    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        self.inner.wakeups()
    }
}

/// On tokio's paused clock: the heartbeat renews every 10 s.
const LEASE: Duration = Duration::from_secs(30);
const BEAT: Duration = Duration::from_secs(10);
const MOMENT: Duration = Duration::from_millis(1);

async fn claimed(store: &Renewals, lease: Duration) -> Lease {
    let idem = Idempotent::new(store.clone()).with_lease(lease);
    match idem.begin("k", Fingerprint::of_bytes(b"b")).await.unwrap() {
        Begin::Run(lease) => lease,
        other => panic!("a fresh key must be claimed: {other:?}"),
    }
}

// Pins the abort of the heartbeat's task when `run` is dropped: a renewal
// in flight is dropped with it, and none follows.
#[tokio::test(start_paused = true)]
async fn a_dropped_run_stops_renewing_at_once_even_mid_renewal() {
    let store = Renewals::new().hold(3);
    let lease = claimed(&store, LEASE).await;
    assert_eq!(lease.heartbeat_interval(), BEAT);
    let run = tokio::spawn(async move { lease.run(std::future::pending::<()>()).await });
    tokio::time::sleep(BEAT * 3 + MOMENT).await;
    assert_eq!(
        (store.made(), store.answered()),
        (3, 2),
        "the third is held"
    );

    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    store.open();
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(
        (store.made(), store.answered()),
        (3, 2),
        "a renewal was made or answered after the run was dropped"
    );
}

// Pins the order at the end of `run`: a renewal in flight when the work
// finishes is answered before `run` returns (so it cannot land after the
// outcome is recorded), and none is made after.
#[tokio::test(start_paused = true)]
async fn run_returns_after_the_renewal_in_flight_and_renews_no_more() {
    let store = Renewals::new().hold(2);
    let lease = claimed(&store, LEASE).await;
    let run = tokio::spawn(async move {
        let ran = lease.run(tokio::time::sleep(BEAT * 2 + MOMENT)).await;
        (ran, lease)
    });
    tokio::time::sleep(BEAT * 3).await;
    assert_eq!((store.made(), store.answered()), (2, 1));
    assert!(!run.is_finished(), "run returned under a renewal in flight");

    store.open();
    let (ran, lease) = run.await.unwrap();
    assert!(!ran.lease_lost);
    assert_eq!((store.made(), store.answered()), (2, 2));
    lease.complete(b"done").await.unwrap();
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(store.made(), 2, "a renewal after the work finished");
    let record = store.load(lease.key().as_str()).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
}

/// A real-time lease for the blocking cases: the work blocks its thread, so
/// tokio's clock cannot be paused.
const REAL_LEASE: Duration = Duration::from_millis(300);

/// Calls `execute` for the owner's key from a thread and runtime of their
/// own, every tenth of the lease until the owner is `done` (then once
/// more), and returns what each call answered: `InProgress` or an outcome.
fn probe_until(idem: Idempotent, done: Arc<AtomicUsize>) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut seen = Vec::new();
            loop {
                let last = done.load(Ordering::SeqCst) == 1;
                let answer: Res<String> = idem
                    .execute("k", "b", || async { Ok("taker".to_owned()) })
                    .await;
                seen.push(match answer {
                    Err(Error::InProgress { .. }) => "in progress".to_owned(),
                    other => format!("{other:?}"),
                });
                if last {
                    return seen;
                }
                tokio::time::sleep(REAL_LEASE / 10).await;
            }
        })
    })
}

// Pins the heartbeat's own task: work that blocks its worker for three
// lease lengths keeps its lease, because another worker renews it (a
// heartbeat polled with the work, or spawned but never started, does not
// renew at all). A take-over needs a whole lease without a renewal; the
// renewals come every 100 ms on a worker the work does not hold.
// `Lease::hold`, for work run outside Rust (the Python and Node bindings):
// renewed past its length while held, settled after the renewal in flight,
// and renewed no more once settled or dropped.
#[tokio::test(start_paused = true)]
async fn a_held_lease_is_renewed_until_it_is_settled() {
    let store = Renewals::new().hold(4);
    let held = claimed(&store, LEASE).await.hold();
    tokio::time::sleep(BEAT * 4 + MOMENT).await;
    assert_eq!(
        (store.made(), store.answered()),
        (4, 3),
        "the fourth is held"
    );
    let key = held.lease().key().as_str().to_owned();
    let settle = tokio::spawn(held.complete(b"done"));
    tokio::time::sleep(MOMENT).await;
    assert!(!settle.is_finished(), "settled under a renewal in flight");
    store.open();
    settle.await.unwrap().unwrap();
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(store.made(), 4, "a renewal after the lease was settled");
    let record = store.load(&key).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_held_lease_renews_no_more_and_keeps_its_key() {
    let store = Renewals::new();
    let held = claimed(&store, LEASE).await.hold();
    tokio::time::sleep(BEAT * 2 + MOMENT).await;
    assert_eq!(store.made(), 2);
    let key = held.lease().key().as_str().to_owned();
    drop(held);
    tokio::time::sleep(LEASE * 3).await;
    assert_eq!(
        store.made(),
        2,
        "a renewal after the held lease was dropped"
    );
    let record = store.load(&key).await.unwrap().unwrap();
    assert_eq!(record.state, State::InFlight, "nothing was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_work_keeps_its_lease_on_a_multi_thread_runtime() {
    let store = Renewals::new();
    let idem = Idempotent::new(store.clone()).with_lease(REAL_LEASE);
    let (started_tx, started) = tokio::sync::oneshot::channel();
    // In a task of its own, as a request's handler runs: on a worker.
    let owner = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.execute("k", "b", || async move {
                started_tx.send(()).unwrap();
                std::thread::sleep(REAL_LEASE * 3);
                Ok::<_, String>("owner".to_owned())
            })
            .await
        }
    });
    started.await.unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let prober = probe_until(idem.clone(), Arc::clone(&done));

    let owned = owner.await.unwrap();
    let renewed = store.made();
    done.store(1, Ordering::SeqCst);
    let seen = tokio::task::spawn_blocking(move || prober.join().unwrap())
        .await
        .unwrap();
    assert!(
        matches!(&owned, Ok(output) if output == "owner"),
        "the owner lost its lease: {owned:?}; the other caller saw {seen:?}"
    );
    assert_eq!(store.taken_over(), 0, "the key was taken over: {seen:?}");
    let (last, probes) = seen.split_last().unwrap();
    assert_eq!(last, &format!("{:?}", Ok::<_, ()>("owner")));
    assert!(
        probes.iter().all(|p| p == "in progress" || p == last),
        "{seen:?}"
    );
    // Holding the key for three leases takes at least two renewals.
    assert!(renewed >= 2, "{renewed} renewals");
}

// Pins what idem promises on a current-thread runtime: work that blocks
// the thread blocks the heartbeat too, so its lease lapses, another caller
// takes the key over, and the owner's outcome is refused with `LeaseLost`.
// The owner blocks until the take-over has happened, so no timing decides.
#[test]
fn blocking_work_loses_its_lease_on_a_current_thread_runtime() {
    let store = Renewals::new();
    let idem = Idempotent::new(store.clone()).with_lease(REAL_LEASE);
    let (taken_tx, taken) = mpsc::channel::<String>();
    let (started_tx, started) = mpsc::channel::<()>();
    let taker = std::thread::spawn({
        let idem = idem.clone();
        move || {
            started.recv().unwrap();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                loop {
                    let answer: Res<String> = idem
                        .execute("k", "b", || async { Ok("taker".to_owned()) })
                        .await;
                    match answer {
                        Err(Error::InProgress { .. }) => {
                            tokio::time::sleep(REAL_LEASE / 10).await;
                        }
                        other => return taken_tx.send(format!("{other:?}")).unwrap(),
                    }
                }
            })
        }
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let owned: Res<String> = runtime.block_on(idem.execute("k", "b", move || async move {
        started_tx.send(()).unwrap();
        let taker = taken
            .recv_timeout(Duration::from_secs(30))
            .expect("the key was never taken over");
        Ok(taker)
    }));
    taker.join().unwrap();
    assert!(matches!(owned, Err(Error::LeaseLost)), "{owned:?}");
    assert_eq!((store.made(), store.taken_over()), (0, 1));
    let replay: Res<String> =
        runtime.block_on(idem.execute("k", "b", || async { Ok("third".to_owned()) }));
    assert_eq!(replay.unwrap(), "taker");
}
