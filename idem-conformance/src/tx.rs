//! The transaction kit: what every SQL store's transactional completion
//! (`execute_in_tx`, `execute_in_tx_remembering`, `complete_in`,
//! `fail_in`) must do, written once over [`StoreTx`], the transaction a
//! store hands idem-core's driver.
//!
//! A store's tests implement [`TxStore`] for a fresh store with a business
//! table of its own, and run every case with [`tx_tests!`](crate::tx_tests).
//! The cases are listed once, in that macro; each is a plain `async fn`
//! here, taking a [`TxFactory`].
//!
//! A store whose open transaction holds its only writer (SQLite's:
//! [`StoreTx::HOLDS_THE_WRITER`]) runs the cases that need no other write
//! while a transaction is open, with `tx_tests!(single_writer: factory)`:
//! there a takeover, a usurper or a second caller waits for the
//! transaction's end instead of racing it, and a connection outside a
//! transaction cannot be named.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{State, Store, StoreErrorKind, StoreTx, TxFuture, Uncommitted};
use idem_core::{Begin, BeginJson, Error, Fingerprint, Idempotent, Lease};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::support::{PATIENCE, POLL};

/// A fresh store with a business table of its own, as the transaction
/// cases use it. Implemented by a store's tests; everything it holds (the
/// tables it made) goes when it is dropped.
pub trait TxStore: Send + Sync + 'static {
    /// The store under test.
    type Store: Store + Clone + 'static;
    /// The connection the work writes through.
    type Conn: ?Sized + Send;
    /// A transaction on the store's database whose
    /// [`settle`](StoreTx::settle) is the store's `complete_in` (for
    /// `Completed`) or `fail_in` (for `Failed`).
    type Tx: StoreTx<Conn = Self::Conn>;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// Opens a transaction on the store's pool.
    fn open(&self) -> impl Future<Output = Self::Tx> + Send;

    /// The statement that writes the business row `(key, amount)`.
    fn insert(&self, key: &str, amount: i64) -> String;

    /// Runs `statement` on the work's connection.
    fn run(conn: &mut Self::Conn, statement: String) -> TxFuture<'_, Result<(), String>>;

    /// The keys of the committed business rows, sorted.
    fn rows(&self) -> impl Future<Output = Vec<String>> + Send;

    /// Replaces the token of every claim in the store's table through a
    /// connection of its own, as an owner taking the key over would.
    fn usurp(&self) -> TxFuture<'static, ()>;

    /// The store's `execute_in_tx`.
    fn execute_in_tx<B, T, E, F>(
        &self,
        idem: &Idempotent,
        key: &str,
        body: &B,
        work: F,
    ) -> impl Future<Output = Result<T, Error<E>>> + Send
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
        F: for<'c> FnOnce(&'c mut Self::Conn) -> TxFuture<'c, Result<T, E>> + Send + 'static;

    /// The store's `execute_in_tx_remembering`.
    fn execute_in_tx_remembering<B, T, E, R, F>(
        &self,
        idem: &Idempotent,
        key: &str,
        body: &B,
        remember: R,
        work: F,
    ) -> impl Future<Output = Result<T, Error<E>>> + Send
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Serialize + DeserializeOwned + Send + 'static,
        R: FnOnce(&E) -> bool + Send + 'static,
        F: for<'c> FnOnce(&'c mut Self::Conn) -> TxFuture<'c, Result<T, E>> + Send + 'static;

    /// The store's `complete_in` for `lease`, on a pooled connection that
    /// is inside no transaction.
    fn complete_outside_a_transaction(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The store's `complete_in` for `lease`, in a transaction on another
    /// database holding a table of the store's name and shape.
    fn complete_on_another_database(
        &self,
        lease: &Lease,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// The store's `complete_in` for `lease` in `tx`, as an application
    /// calls it: the guard that ends with the transaction.
    fn complete_in<'a>(
        tx: &'a mut Self::Tx,
        lease: Lease,
        payload: &'a [u8],
    ) -> impl Future<Output = Result<Uncommitted, Error>> + Send + 'a;
}

/// Builds a fresh [`TxStore`] for each case, or `None` (with the reason
/// printed, or a panic under `CI`) to skip it: a store's tests skip one by
/// one when their server is away. Any `async fn() -> Option<S>` is one.
pub trait TxFactory: Send + Sync + 'static {
    /// What it builds.
    type Store: TxStore;

    /// A store no other case sees.
    fn fixture(&self) -> impl Future<Output = Option<Self::Store>> + Send;
}

impl<F, Fut, S> TxFactory for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<S>> + Send,
    S: TxStore,
{
    type Store = S;

    fn fixture(&self) -> impl Future<Output = Option<S>> + Send {
        self()
    }
}

/// A case's store and an `Idempotent` claiming keys in it.
struct Kit<S> {
    db: S,
    idem: Idempotent,
}

impl<S: TxStore> Kit<S> {
    async fn new(factory: &impl TxFactory<Store = S>, lease: Duration) -> Option<Kit<S>> {
        let db = factory.fixture().await?;
        let idem = Idempotent::new(db.store().clone()).with_lease(lease);
        Some(Kit { db, idem })
    }

    /// Charges `amount` under `key`, its row in the same transaction as
    /// its outcome.
    async fn charge(
        &self,
        key: &str,
        amount: i64,
        runs: &Arc<AtomicUsize>,
    ) -> Result<i64, Error<String>> {
        let (sql, runs) = (self.db.insert(key, amount), Arc::clone(runs));
        self.db
            .execute_in_tx(&self.idem, key, &amount, move |conn| {
                Box::pin(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    S::run(conn, sql).await?;
                    Ok(amount)
                })
            })
            .await
    }

    /// Charges under `key`, declining (a remembered failure, its audit row
    /// written first) over 100 and failing plainly below 0.
    async fn charge_or_decline(
        &self,
        key: &str,
        amount: i64,
        runs: &Arc<AtomicUsize>,
    ) -> Result<i64, Error<String>> {
        let (sql, runs) = (self.db.insert(key, amount), Arc::clone(runs));
        self.db
            .execute_in_tx_remembering(
                &self.idem,
                key,
                &amount,
                |e: &String| e.starts_with("declined"),
                move |conn| {
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        S::run(conn, sql).await?;
                        match amount {
                            a if a > 100 => Err(format!("declined: {a}")),
                            a if a < 0 => Err("bad amount".to_owned()),
                            a => Ok(a),
                        }
                    })
                },
            )
            .await
    }

    async fn lease(&self, key: &str) -> Lease {
        match self.idem.begin(key, Fingerprint::of_bytes(b"b")).await {
            Ok(Begin::Run(lease)) => lease,
            other => panic!("expected to run, got {other:?}"),
        }
    }

    /// The lease `charge(key, amount)` would claim.
    async fn claim(&self, key: &str, amount: i64) -> Lease {
        match self.idem.begin_json::<_, i64, String>(key, &amount).await {
            Ok(BeginJson::Run(lease)) => lease,
            other => panic!("expected to run, got {other:?}"),
        }
    }

    /// Polls until `key` holds no record, within [`PATIENCE`].
    async fn released(&self, key: &str) {
        let give_up = Instant::now() + PATIENCE;
        while let Some(state) = self.state(key).await {
            assert!(Instant::now() < give_up, "{key} is still {state:?}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// The key's new lease once its owner's lapsed, polled for.
    async fn take_over(&self, key: &str) -> Lease {
        let give_up = Instant::now() + PATIENCE;
        loop {
            match self.idem.begin(key, Fingerprint::of_bytes(b"b")).await {
                Ok(Begin::Run(lease)) => return lease,
                Err(Error::InProgress { .. }) if Instant::now() < give_up => {
                    tokio::time::sleep(POLL).await;
                }
                other => panic!("expected to take the key over, got {other:?}"),
            }
        }
    }

    async fn state(&self, key: &str) -> Option<State> {
        let key = self.idem.key(key).unwrap();
        let record = self.db.store().load(key.as_str()).await.unwrap();
        record.map(|r| r.state)
    }

    /// Writes the business row `(key, 1)` in `tx`.
    async fn write(&self, tx: &mut S::Tx, key: &str) {
        S::run(tx.conn(), self.db.insert(key, 1)).await.unwrap();
    }
}

fn assert_config(result: Result<(), Error>, words: &str) {
    match result {
        Err(Error::Store { source, .. }) => {
            assert_eq!(source.kind(), StoreErrorKind::Config, "{source}");
            assert!(source.to_string().contains(words), "{source}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// The first call writes its row and outcome in one commit; retries replay.
pub async fn rows_and_outcome_commit_together_and_retries_replay<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(f.charge("order-1", 1250, &runs).await.unwrap(), 1250);
    assert_eq!(f.charge("order-1", 1250, &runs).await.unwrap(), 1250);
    let other = f.charge("order-1", 999, &runs).await;
    assert!(matches!(other, Err(Error::Mismatch)), "{other:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.db.rows().await, ["order-1"]);
    assert_eq!(f.state("order-1").await, Some(State::Completed));
}

/// Many callers on few keys, all at once: one run and one row per key.
pub async fn racing_callers_make_one_row_per_key<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let f = Arc::new(f);
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..64_i64)
        .map(|i| {
            let (f, runs) = (Arc::clone(&f), Arc::clone(&runs));
            let amount = i % 8 + 1;
            let call = async move { f.charge(&format!("order-{amount}"), amount, &runs).await };
            (amount, tokio::spawn(call))
        })
        .collect();
    let mut answered = [0; 8];
    for (amount, task) in tasks {
        match task.await.unwrap() {
            Ok(value) if value == amount => answered[(amount - 1) as usize] += 1,
            Err(Error::InProgress { .. }) => {}
            other => panic!("order-{amount}: unexpected {other:?}"),
        }
    }
    assert!(
        answered.iter().all(|n| *n >= 1),
        "answers per key: {answered:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 8);
    assert_eq!(f.db.rows().await.len(), 8);
}

/// An error from the work rolls its rows back and releases the key.
pub async fn a_work_error_rolls_back_its_rows_and_releases_the_key<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let sql = f.db.insert("k", 1);
    let failed: Result<i64, Error<String>> =
        f.db.execute_in_tx(&f.idem, "k", "body", move |conn| {
            Box::pin(async move {
                <X::Store as TxStore>::run(conn, sql).await.unwrap();
                Err("declined".to_owned())
            })
        })
        .await;
    assert!(
        matches!(&failed, Err(Error::Work(e)) if e == "declined"),
        "{failed:?}"
    );
    assert!(f.db.rows().await.is_empty());
    assert_eq!(f.state("k").await, None, "the key is released");
    let runs = Arc::new(AtomicUsize::new(0));
    f.charge("k", 1, &runs).await.unwrap();
    assert_eq!(f.db.rows().await, ["k"]);
}

/// A remembered failure commits with the work's rows, in its transaction,
/// and every retry gets it back without running; any other error still
/// rolls back and releases.
pub async fn a_remembered_failure_commits_with_its_rows_and_replays_without_running<
    X: TxFactory,
>(
    factory: &X,
) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let declined = f.charge_or_decline("big", 500, &runs).await;
        assert!(
            matches!(&declined, Err(Error::Work(e)) if e == "declined: 500"),
            "{declined:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.state("big").await, Some(State::Failed));
    assert_eq!(
        f.db.rows().await,
        ["big"],
        "the audit row commits with the failure"
    );

    let bad = f.charge_or_decline("neg", -1, &runs).await;
    assert!(
        matches!(&bad, Err(Error::Work(e)) if e == "bad amount"),
        "{bad:?}"
    );
    assert_eq!(f.state("neg").await, None);
    assert_eq!(f.db.rows().await, ["big"]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    assert_eq!(f.charge_or_decline("ok", 5, &runs).await.unwrap(), 5);
    assert_eq!(f.charge_or_decline("ok", 5, &runs).await.unwrap(), 5);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(f.db.rows().await, ["big", "ok"]);
}

/// The heartbeat renews through another connection while the transaction
/// is open, so work longer than the lease keeps its key and commits.
pub async fn the_heartbeat_keeps_the_lease_while_the_transaction_is_open<X: TxFactory>(
    factory: &X,
) {
    let Some(f) = Kit::new(factory, Duration::from_millis(300)).await else {
        return;
    };
    let f = Arc::new(f);
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = {
        let (f, runs) = (Arc::clone(&f), Arc::clone(&runs));
        let sql = f.db.insert("k", 1);
        tokio::spawn(async move {
            f.db.execute_in_tx(&f.idem, "k", "body", move |conn| {
                Box::pin(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    <X::Store as TxStore>::run(conn, sql).await?;
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                    Ok::<_, String>(1_i64)
                })
            })
            .await
        })
    };
    // Others keep being told it is in progress, never taking it over.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let other: Result<i64, Error<String>> =
            f.db.execute_in_tx(&f.idem, "k", "body", |_| Box::pin(async { Ok(2) }))
                .await;
        assert!(matches!(other, Err(Error::InProgress { .. })), "{other:?}");
    }
    assert_eq!(slow.await.unwrap().unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.db.rows().await, ["k"]);
}

// Pins the stale owner: its lease lapsed and the key was taken over while
// its transaction was open.
/// A stale owner's fenced write matches no row: it gets `LeaseLost`, and
/// its rows never land while the taker's commit with its outcome.
pub async fn a_stale_owner_gets_lease_lost_and_its_rows_never_land<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, Duration::from_millis(200)).await else {
        return;
    };
    let stale = f.lease("k").await;
    let mut tx = f.db.open().await;
    f.write(&mut tx, "stale").await;
    // No heartbeat runs: the lease lapses on the database's clock.
    let taker = f.take_over("k").await;
    assert_ne!(taker.token(), stale.token());
    let lost = tx.settle(&stale, State::Completed, b"1").await;
    assert!(matches!(lost, Err(Error::LeaseLost)), "{lost:?}");
    tx.rollback().await;

    let mut tx = f.db.open().await;
    f.write(&mut tx, "taker").await;
    tx.settle(&taker, State::Completed, b"2").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(f.db.rows().await, ["taker"]);
    assert_eq!(f.state("k").await, Some(State::Completed));
}

/// A takeover while `execute_in_tx`'s work runs: the caller gets
/// `LeaseLost` and the work's rows roll back.
pub async fn execute_in_tx_rolls_back_a_stale_owner<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let (sql, usurp) = (f.db.insert("k", 1), f.db.usurp());
    let stale: Result<i64, Error<String>> =
        f.db.execute_in_tx(&f.idem, "k", "body", move |conn| {
            Box::pin(async move {
                <X::Store as TxStore>::run(conn, sql).await?;
                // Another owner takes the key over meanwhile.
                usurp.await;
                Ok(1)
            })
        })
        .await;
    assert!(matches!(stale, Err(Error::LeaseLost)), "{stale:?}");
    assert!(f.db.rows().await.is_empty());
    assert_eq!(f.state("k").await, Some(State::InFlight));
}

/// A lease already completed or released cannot settle again inside a
/// transaction; its rows never land.
pub async fn a_lease_used_after_it_was_settled_is_lease_lost<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let lease = f.lease("k").await;
    lease.complete(b"1").await.unwrap();
    // Both settled before the transaction opens, so that a single-writer
    // store, whose writes wait for an open transaction, runs it too.
    let released = f.lease("k2").await;
    released.release().await.unwrap();
    let mut tx = f.db.open().await;
    f.write(&mut tx, "again").await;
    let again = tx.settle(&lease, State::Completed, b"2").await;
    assert!(matches!(again, Err(Error::LeaseLost)), "{again:?}");
    let again = tx.settle(&released, State::Failed, b"2").await;
    assert!(matches!(again, Err(Error::LeaseLost)), "{again:?}");
    tx.rollback().await;
    assert!(f.db.rows().await.is_empty());
    assert_eq!(f.state("k").await, Some(State::Completed));
    assert_eq!(f.state("k2").await, None);
}

/// A connection outside a transaction would commit the outcome alone: it
/// is refused with a config error and nothing is recorded.
pub async fn completing_outside_a_transaction_is_refused<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let lease = f.lease("k").await;
    let refused = f.db.complete_outside_a_transaction(&lease).await;
    assert_config(refused, "inside a transaction");
    assert_eq!(f.state("k").await, Some(State::InFlight));
}

/// A transaction on another database is refused with a config error that
/// says so, even where a table of the same name exists.
pub async fn a_transaction_on_another_database_is_refused<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let lease = f.lease("k").await;
    let refused = f.db.complete_on_another_database(&lease).await;
    assert_config(refused, "database");
    assert_eq!(f.state("k").await, Some(State::InFlight));
}

// Pins the rolled-back completion: the key stayed claimed for the whole
// lease, every retry `InProgress`, though nothing of the attempt landed.
/// A transaction rolled back after `complete_in` gives the key back: a
/// retry runs at once and leaves exactly one row.
pub async fn a_rolled_back_completion_gives_the_key_back<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let lease = f.claim("k", 1).await;
    let mut tx = f.db.open().await;
    f.write(&mut tx, "k").await;
    let done = <X::Store as TxStore>::complete_in(&mut tx, lease, b"1")
        .await
        .unwrap();
    done.rollback(tx.rollback()).await;
    assert_eq!(f.state("k").await, None, "the key is released");
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(f.charge("k", 1, &runs).await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.db.rows().await, ["k"]);
}

/// A transaction dropped after `complete_in`, guard and all, gives the key
/// back once it has ended: a retry runs and leaves exactly one row.
pub async fn a_dropped_completion_gives_the_key_back<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let lease = f.claim("k", 1).await;
    let mut tx = f.db.open().await;
    f.write(&mut tx, "k").await;
    let done = <X::Store as TxStore>::complete_in(&mut tx, lease, b"1")
        .await
        .unwrap();
    drop(done);
    drop(tx);
    // The release is spawned and waits for the dropped transaction's
    // rollback: well within `PATIENCE`, far below the minute's lease.
    f.released("k").await;
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(f.charge("k", 1, &runs).await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.db.rows().await, ["k"]);
}

/// The release a guard makes is fenced on the in-flight state: after its
/// transaction committed it changes nothing, and retries replay.
pub async fn a_release_after_the_commit_changes_nothing<X: TxFactory>(factory: &X) {
    let Some(f) = Kit::new(factory, MINUTE).await else {
        return;
    };
    let lease = f.claim("k", 1).await;
    let mut tx = f.db.open().await;
    f.write(&mut tx, "k").await;
    let done = <X::Store as TxStore>::complete_in(&mut tx, lease, b"1")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // What a guard dropped after the commit does, awaited here.
    done.rollback(async {}).await;
    assert_eq!(f.state("k").await, Some(State::Completed));
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(f.charge("k", 1, &runs).await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "replayed");
    assert_eq!(f.db.rows().await, ["k"]);
}

/// Emits one `#[tokio::test]` per transaction case, in a module `kit`
/// (`kit::a_stale_owner_gets_lease_lost_and_its_rows_never_land`, …), for
/// the [`TxFactory`] at `$factory`. The one list of the cases.
///
/// `tx_tests!(single_writer: $factory)` leaves out the four cases that
/// write, or name a connection, while a transaction is open (the heartbeat
/// against a second caller, the two stale owners, completing outside a
/// transaction), for a store whose open transaction holds its only writer.
///
/// Each test runs on a multi-threaded runtime with four workers: the
/// heartbeat and racing callers need more than one.
#[macro_export]
macro_rules! tx_tests {
    ($factory:path) => {
        $crate::tx_tests! { @cases $factory:
            the_heartbeat_keeps_the_lease_while_the_transaction_is_open,
            a_stale_owner_gets_lease_lost_and_its_rows_never_land,
            execute_in_tx_rolls_back_a_stale_owner,
            completing_outside_a_transaction_is_refused,
        }
    };
    (single_writer: $factory:path) => {
        $crate::tx_tests! { @cases $factory: }
    };
    (@cases $factory:path: $($concurrent:ident,)*) => {
        $crate::__tx_tests! { $factory:
            rows_and_outcome_commit_together_and_retries_replay,
            racing_callers_make_one_row_per_key,
            a_work_error_rolls_back_its_rows_and_releases_the_key,
            a_remembered_failure_commits_with_its_rows_and_replays_without_running,
            a_lease_used_after_it_was_settled_is_lease_lost,
            a_transaction_on_another_database_is_refused,
            a_rolled_back_completion_gives_the_key_back,
            a_dropped_completion_gives_the_key_back,
            a_release_after_the_commit_changes_nothing,
            $($concurrent,)*
        }
    };
}

/// Emits the tests of [`tx_tests!`](crate::tx_tests).
#[doc(hidden)]
#[macro_export]
macro_rules! __tx_tests {
    ($factory:path: $($case:ident),* $(,)?) => {
        mod kit {
            #[allow(unused_imports)]
            use super::*;
            // The test attribute names its runtime `tokio`; this lets it
            // resolve in a crate that depends on no tokio of its own.
            use $crate::__private::tokio;

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    $crate::tx::$case(&$factory).await;
                }
            )*
        }
    };
}
