//! Transactions that do not commit give the key back at once, whatever
//! ended them: a trigger's `RAISE(ROLLBACK)`, `RAISE(ABORT)` or
//! `RAISE(FAIL)`, a constraint violation (plain, or `OR ROLLBACK`), or the
//! work's own error; on every transactional path (`settle_in_tx`,
//! `execute_in_batch`, `execute_in_tx`, `complete_in`). Each retry runs at
//! once, runs exactly once, and leaves one attempt's rows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_core::store::{State, Store};
use idem_core::{Begin, Error, Fingerprint, Idempotent, Lease};
use idem_sqlite::{Settle, SqliteStore};
use rusqlite::Connection;
use tempfile::TempDir;

use crate::support;

/// What ends the first attempt of a work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// A trigger's `RAISE(ROLLBACK)`: SQLite undoes the whole transaction.
    TriggerRollback,
    /// A trigger's `RAISE(ABORT)`: the statement is undone.
    TriggerAbort,
    /// A trigger's `RAISE(FAIL)`: the statement stops where it is.
    TriggerFail,
    /// A `NOT NULL` violation, which aborts the statement.
    Constraint,
    /// The same violation under `OR ROLLBACK`: the whole transaction goes.
    ConstraintOrRollback,
    /// No database error: the work returns an error of its own.
    WorkError,
}

const EVERY: [Stop; 6] = [
    Stop::TriggerRollback,
    Stop::TriggerAbort,
    Stop::TriggerFail,
    Stop::Constraint,
    Stop::ConstraintOrRollback,
    Stop::WorkError,
];

/// The kinds after which SQLite has no transaction open any more.
const UNDOING: [Stop; 2] = [Stop::TriggerRollback, Stop::ConstraintOrRollback];

impl Stop {
    /// The statement that fails, for a key bound as `?1`.
    fn statement(self) -> &'static str {
        match self {
            Stop::TriggerRollback => "INSERT INTO charges VALUES (?1, -1)",
            Stop::TriggerAbort => "INSERT INTO charges VALUES (?1, -2)",
            Stop::TriggerFail => "INSERT INTO charges VALUES (?1, -3)",
            Stop::Constraint => "INSERT INTO charges VALUES (?1, NULL)",
            Stop::ConstraintOrRollback => "INSERT OR ROLLBACK INTO charges VALUES (?1, NULL)",
            Stop::WorkError => "INSERT INTO charges VALUES (?1, 1)",
        }
    }
}

const SCHEMA: &str = "
    CREATE TABLE audit (key TEXT NOT NULL);
    CREATE TABLE charges (key TEXT PRIMARY KEY, amount INTEGER NOT NULL);
    CREATE TRIGGER refuse_rollback BEFORE INSERT ON charges WHEN NEW.amount = -1
    BEGIN SELECT RAISE(ROLLBACK, 'refused: rollback'); END;
    CREATE TRIGGER refuse_abort BEFORE INSERT ON charges WHEN NEW.amount = -2
    BEGIN SELECT RAISE(ABORT, 'refused: abort'); END;
    CREATE TRIGGER refuse_fail BEFORE INSERT ON charges WHEN NEW.amount = -3
    BEGIN SELECT RAISE(FAIL, 'refused: fail'); END;
";

/// The work: an audit row, then the charge; the first attempt ends as
/// `abort` says, every later one charges.
fn work(conn: &Connection, key: &str, abort: Option<Stop>) -> Result<i64, String> {
    let failed = |e: rusqlite::Error| e.to_string();
    conn.execute("INSERT INTO audit VALUES (?1)", [key])
        .map_err(failed)?;
    let statement = abort.map_or("INSERT INTO charges VALUES (?1, 1)", Stop::statement);
    conn.execute(statement, [key]).map_err(failed)?;
    if abort == Some(Stop::WorkError) {
        return Err("declined".to_owned());
    }
    Ok(conn.last_insert_rowid())
}

struct Fixture {
    store: SqliteStore,
    idem: Idempotent,
    /// Every run of the work, failed ones included.
    runs: Arc<AtomicUsize>,
    _dir: TempDir,
}

async fn fixture() -> Fixture {
    let (store, dir, _) = support::fresh().await;
    let mut tx = store.begin().await.unwrap();
    tx.call(|conn| conn.execute_batch(SCHEMA)).await.unwrap();
    tx.commit().await.unwrap();
    Fixture {
        idem: Idempotent::new(store.clone()),
        store,
        runs: Arc::new(AtomicUsize::new(0)),
        _dir: dir,
    }
}

impl Fixture {
    /// The work as a closure for the writer thread, counted.
    fn counted(
        &self,
        key: &str,
        abort: Option<Stop>,
    ) -> impl FnOnce(&Connection) -> Result<i64, String> + Send + 'static {
        let (key, runs) = (key.to_owned(), Arc::clone(&self.runs));
        move |conn| {
            runs.fetch_add(1, Ordering::SeqCst);
            work(conn, &key, abort)
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    async fn lease(&self, key: &str) -> Lease {
        match self.idem.begin(key, Fingerprint::of_bytes(b"b")).await {
            Ok(Begin::Run(lease)) => lease,
            other => panic!("{key}: expected to run at once, got {other:?}"),
        }
    }

    async fn state(&self, key: &str) -> Option<State> {
        let key = self.idem.key(key).unwrap();
        let record = self.store.load(key.as_str()).await.unwrap();
        record.map(|r| r.state)
    }

    /// The rows the key's attempts left, audit and charges.
    async fn rows(&self, key: &str) -> (i64, i64) {
        let mut tx = self.store.begin().await.unwrap();
        let key = key.to_owned();
        let counts = tx
            .call(move |conn| {
                let count = |table: &str| {
                    conn.query_row(
                        &format!("SELECT count(*) FROM {table} WHERE key = ?1"),
                        [&key],
                        |row| row.get(0),
                    )
                };
                Ok((count("audit")?, count("charges")?))
            })
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        counts
    }

    /// Settles `lease` with `settle_in_tx`, as a caller that releases on
    /// the work's error would.
    async fn settle(&self, lease: &Lease, key: &str, abort: Option<Stop>) -> Result<(), Error> {
        let work = self.counted(key, abort);
        self.store
            .settle_in_tx(lease, move |conn| match work(conn) {
                Ok(id) => Settle::Complete(id.to_string().into_bytes()),
                Err(_) => Settle::Release,
            })
            .await
    }

    async fn in_batch(&self, key: &str, abort: Option<Stop>) -> Result<i64, Error<String>> {
        let work = self.counted(key, abort);
        self.store
            .execute_in_batch(&self.idem, key, "b", work)
            .await
    }

    async fn in_tx(&self, key: &str, abort: Option<Stop>) -> Result<i64, Error<String>> {
        let work = self.counted(key, abort);
        self.store
            .execute_in_tx(&self.idem, key, "b", |tx| {
                Box::pin(async move {
                    let ran = tx.call(move |conn| Ok(work(conn))).await;
                    ran.map_err(|e| e.to_string()).and_then(|ran| ran)
                })
            })
            .await
    }

    /// After a failed first attempt: the key is free now, the retry runs
    /// once and commits one attempt's rows, a third call replays.
    async fn assert_retry_runs_once(&self, key: &str, abort: Stop) {
        assert_eq!(self.state(key).await, None, "{abort:?}: the key was kept");
        let before = self.runs();
        let first = self.in_batch(key, None).await;
        let first = first.unwrap_or_else(|e| panic!("{abort:?}: the retry failed: {e:?}"));
        assert_eq!(self.runs(), before + 1, "{abort:?}: the retry did not run");
        let replayed = self.in_batch(key, None).await.unwrap();
        assert_eq!(replayed, first, "{abort:?}: the third call did not replay");
        assert_eq!(self.runs(), before + 1, "{abort:?}: the work ran again");
        assert_eq!(
            self.rows(key).await,
            (1, 1),
            "{abort:?}: rows of two attempts"
        );
    }
}

/// Regression test: `settle_in_tx` gave an error but kept the key claimed
/// when SQLite undid its transaction (a trigger's `RAISE(ROLLBACK)`, an
/// `OR ROLLBACK` conflict), so the retry was `InProgress` for the whole
/// lease. Pins that every way the transaction fails to commit frees the key
/// before the call returns.
#[tokio::test]
async fn settle_in_tx_gives_the_key_back_whatever_stopped_its_commit() {
    let f = fixture().await;
    for abort in EVERY {
        let key = format!("settle-{abort:?}");
        let lease = f.lease(&key).await;
        let settled = f.settle(&lease, &key, Some(abort)).await;
        match abort {
            // Released by the work itself: the settle committed.
            Stop::TriggerAbort | Stop::TriggerFail | Stop::Constraint | Stop::WorkError => {
                settled.unwrap_or_else(|e| panic!("{abort:?}: {e:?}"));
            }
            Stop::TriggerRollback | Stop::ConstraintOrRollback => {
                assert!(
                    matches!(settled, Err(Error::Store { .. })),
                    "{abort:?}: {settled:?}"
                );
            }
        }
        assert_eq!(f.runs(), 1, "{abort:?}");
        f.assert_retry_runs_once(&key, abort).await;
        f.runs.store(0, Ordering::SeqCst);
    }
}

/// Regression test: a work that ignores the statement SQLite rolled back
/// and asks for a completion gets an error, and the key goes back all the
/// same, since nothing of the attempt committed.
#[tokio::test]
async fn settle_in_tx_gives_the_key_back_when_the_work_ignores_the_abort() {
    let f = fixture().await;
    for abort in UNDOING {
        let key = format!("ignored-{abort:?}");
        let lease = f.lease(&key).await;
        let key_owned = key.clone();
        let settled = f
            .store
            .settle_in_tx(&lease, move |conn| {
                let _ = work(conn, &key_owned, Some(abort));
                Settle::Complete(b"0".to_vec())
            })
            .await;
        assert!(
            matches!(settled, Err(Error::Store { .. })),
            "{abort:?}: {settled:?}"
        );
        f.assert_retry_runs_once(&key, abort).await;
    }
}

/// `execute_in_batch`: the work's error (its own, or the statement's that
/// the database refused) frees the key, and the retry runs once.
#[tokio::test]
async fn execute_in_batch_gives_the_key_back_whatever_stopped_its_commit() {
    let f = fixture().await;
    for abort in EVERY {
        let key = format!("batch-{abort:?}");
        let failed = f.in_batch(&key, Some(abort)).await;
        assert!(
            matches!(failed, Err(Error::Work(_))),
            "{abort:?}: {failed:?}"
        );
        assert_eq!(f.runs(), 1, "{abort:?}");
        f.assert_retry_runs_once(&key, abort).await;
        f.runs.store(0, Ordering::SeqCst);
    }
}

/// `execute_in_tx` on a `SqliteTx`: the same, when the work's statements
/// run on a transaction held across awaits.
#[tokio::test]
async fn execute_in_tx_gives_the_key_back_whatever_stopped_its_commit() {
    let f = fixture().await;
    for abort in EVERY {
        let key = format!("tx-{abort:?}");
        let failed = f.in_tx(&key, Some(abort)).await;
        assert!(
            matches!(failed, Err(Error::Work(_))),
            "{abort:?}: {failed:?}"
        );
        assert_eq!(f.runs(), 1, "{abort:?}");
        f.assert_retry_runs_once(&key, abort).await;
        f.runs.store(0, Ordering::SeqCst);
    }
}

/// Regression test: `complete_in` on a transaction SQLite had undone
/// dropped the lease with the key still claimed. The transaction can
/// never commit, so the key goes back before the error returns.
#[tokio::test]
async fn complete_in_after_the_database_undid_the_transaction_gives_the_key_back() {
    let f = fixture().await;
    for abort in UNDOING {
        let key = format!("complete-in-{abort:?}");
        let lease = f.lease(&key).await;
        let mut tx = f.store.begin().await.unwrap();
        let work = f.counted(&key, Some(abort));
        let ran = tx.call(move |conn| Ok(work(conn))).await;
        assert!(!matches!(ran, Ok(Ok(_))), "{abort:?}: {ran:?}");
        let done = f.store.complete_in(&mut tx, lease, b"0").await;
        assert!(done.is_err(), "{abort:?}: {done:?}");
        drop(tx);
        f.assert_retry_runs_once(&key, abort).await;
    }
}

/// A completion whose transaction SQLite then undid (a later statement's
/// `RAISE(ROLLBACK)`): the commit fails and the guard gives the key back.
#[tokio::test]
async fn a_commit_after_the_database_undid_the_transaction_gives_the_key_back() {
    let f = fixture().await;
    for abort in UNDOING {
        let key = format!("commit-{abort:?}");
        let lease = f.lease(&key).await;
        let mut tx = f.store.begin().await.unwrap();
        let done = f.store.complete_in(&mut tx, lease, b"0").await.unwrap();
        let work = f.counted(&key, Some(abort));
        let ran = tx.call(move |conn| Ok(work(conn))).await;
        assert!(!matches!(ran, Ok(Ok(_))), "{abort:?}: {ran:?}");
        let committed = done.commit(tx.commit()).await;
        assert!(committed.is_err(), "{abort:?}: the commit succeeded");
        f.assert_retry_runs_once(&key, abort).await;
    }
}

/// A panic in the work keeps the key claimed even when SQLite had undone
/// the transaction first: the work may have half happened elsewhere, so
/// only its lease lapsing frees the key.
#[tokio::test]
async fn a_panic_after_the_database_undid_the_transaction_keeps_the_key() {
    let f = Arc::new(fixture().await);
    let g = Arc::clone(&f);
    let panicked = tokio::spawn(async move {
        let work = g.counted("panic", Some(Stop::TriggerRollback));
        g.store
            .execute_in_batch(
                &g.idem,
                "panic",
                "b",
                move |conn: &Connection| -> Result<(), String> {
                    let _ = work(conn);
                    panic!("the work panicked")
                },
            )
            .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(f.state("panic").await, Some(State::InFlight));
    assert_eq!(f.rows("panic").await, (0, 0));
}
