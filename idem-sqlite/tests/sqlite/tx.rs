//! Transactional completion inside the writer's group commit
//! (`execute_in_batch`, `settle_in_tx`): the work's rows and the outcome
//! commit together on the writer thread, a stale owner's rows never land,
//! the work cannot end the transaction, and other callers keep their group
//! commit. The shared shape (`SqliteTx`, `complete_in`, `execute_in_tx`)
//! runs the conformance kit's transaction cases in `tx_kit.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{State, Store};
use idem_core::{Begin, Error, Fingerprint, Idempotent};
use idem_sqlite::{Settle, SqliteStore};
use rusqlite::Connection;
use tempfile::TempDir;

use crate::support;

struct Fixture {
    store: SqliteStore,
    idem: Idempotent,
    _dir: TempDir,
}

async fn fixture(lease: Duration) -> Fixture {
    let (store, dir, _) = support::fresh().await;
    let idem = Idempotent::new(store.clone()).with_lease(lease);
    store
        .execute_in_batch(&idem, "schema", &(), |conn| {
            conn.execute_batch("CREATE TABLE charges (key TEXT PRIMARY KEY, amount INTEGER)")
        })
        .await
        .unwrap();
    Fixture {
        store,
        idem,
        _dir: dir,
    }
}

impl Fixture {
    async fn rows(&self) -> Vec<String> {
        let count = Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = Arc::clone(&count);
        let probe = self.lease(&format!("probe-{}", rand_suffix())).await;
        self.store
            .settle_in_tx(&probe, move |conn| {
                let mut rows = conn
                    .prepare("SELECT key FROM charges ORDER BY key")
                    .unwrap();
                let keys = rows.query_map([], |row| row.get(0)).unwrap();
                *out.lock().unwrap() = keys.map(Result::unwrap).collect();
                Settle::Release
            })
            .await
            .unwrap();
        let rows = count.lock().unwrap().clone();
        rows
    }

    async fn charge(
        &self,
        key: &str,
        runs: &Arc<AtomicUsize>,
    ) -> Result<i64, Error<rusqlite::Error>> {
        let (key_owned, runs) = (key.to_owned(), Arc::clone(runs));
        self.store
            .execute_in_batch(&self.idem, key, "body", move |conn: &Connection| {
                runs.fetch_add(1, Ordering::SeqCst);
                conn.execute("INSERT INTO charges VALUES (?1, 1)", [&key_owned])?;
                Ok(conn.last_insert_rowid())
            })
            .await
    }

    async fn lease(&self, key: &str) -> idem_core::Lease {
        match self
            .idem
            .begin(key, Fingerprint::of_bytes(b"b"))
            .await
            .unwrap()
        {
            Begin::Run(lease) => lease,
            other => panic!("expected to run, got {other:?}"),
        }
    }

    async fn state(&self, key: &str) -> Option<State> {
        let key = self.idem.key(key).unwrap();
        self.store
            .load(key.as_str())
            .await
            .unwrap()
            .map(|r| r.state)
    }
}

fn rand_suffix() -> u64 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst) as u64
}

/// The first call writes its row and outcome in one commit; retries replay.
#[tokio::test]
async fn rows_and_outcome_commit_together_and_retries_replay() {
    let f = fixture(Duration::from_secs(60)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let first = f.charge("order-1", &runs).await.unwrap();
    assert_eq!(f.charge("order-1", &runs).await.unwrap(), first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.rows().await, vec!["order-1".to_owned()]);
    assert_eq!(f.state("order-1").await, Some(State::Completed));
}

/// Many callers on few keys, all at once: one row per key, and the
/// transactional work shares commits with the plain operations around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_callers_make_one_row_per_key() {
    let f = Arc::new(fixture(Duration::from_secs(60)).await);
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (f, runs) = (Arc::clone(&f), Arc::clone(&runs));
            tokio::spawn(async move { f.charge(&format!("order-{}", i % 8), &runs).await })
        })
        .collect();
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) | Err(Error::InProgress { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 8);
    assert_eq!(f.rows().await.len(), 8);
}

/// An error from the work undoes its rows and releases the key.
#[tokio::test]
async fn a_work_error_undoes_its_rows_and_releases_the_key() {
    let f = fixture(Duration::from_secs(60)).await;
    let failed: Result<i64, Error<&str>> = f
        .store
        .execute_in_batch(&f.idem, "k", "body", |conn: &Connection| {
            conn.execute("INSERT INTO charges VALUES ('k', 1)", [])
                .unwrap();
            Err("declined")
        })
        .await;
    assert!(matches!(failed, Err(Error::Work("declined"))));
    assert!(f.rows().await.is_empty());
    assert_eq!(f.state("k").await, None);
}

/// Regression guard for the stale owner: after a takeover its rows are
/// undone with its savepoint and it gets `LeaseLost`.
#[tokio::test]
async fn a_stale_owner_gets_lease_lost_and_its_rows_never_land() {
    let f = fixture(Duration::from_millis(100)).await;
    let stale = f.lease("k").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let taker = f.lease("k").await;
    let lost = f
        .store
        .settle_in_tx(&stale, |conn| {
            conn.execute("INSERT INTO charges VALUES ('stale', 1)", [])
                .unwrap();
            Settle::Complete(b"1".to_vec())
        })
        .await;
    assert!(matches!(lost, Err(Error::LeaseLost)), "{lost:?}");
    f.store
        .settle_in_tx(&taker, |conn| {
            conn.execute("INSERT INTO charges VALUES ('taker', 2)", [])
                .unwrap();
            Settle::Complete(b"2".to_vec())
        })
        .await
        .unwrap();
    assert_eq!(f.rows().await, vec!["taker".to_owned()]);
    assert_eq!(f.state("k").await, Some(State::Completed));
}

/// A lease already settled cannot settle again; its rows are undone.
#[tokio::test]
async fn a_lease_used_after_it_was_settled_is_lease_lost() {
    let f = fixture(Duration::from_secs(60)).await;
    let lease = f.lease("k").await;
    lease.complete(b"1").await.unwrap();
    let again = f
        .store
        .settle_in_tx(&lease, |conn| {
            conn.execute("INSERT INTO charges VALUES ('again', 1)", [])
                .unwrap();
            Settle::Complete(b"2".to_vec())
        })
        .await;
    assert!(matches!(again, Err(Error::LeaseLost)), "{again:?}");
    assert!(f.rows().await.is_empty());
}

/// A work that writes and then settles with `Release` (this store's form
/// of a rollback after completing) gives the key back: a retry runs at
/// once and leaves exactly one row.
#[tokio::test]
async fn a_released_settle_gives_the_key_back_for_a_retry() {
    let f = fixture(Duration::from_secs(60)).await;
    let lease = f.lease("k").await;
    f.store
        .settle_in_tx(&lease, |conn| {
            conn.execute("INSERT INTO charges VALUES ('k', 1)", [])
                .unwrap();
            Settle::Release
        })
        .await
        .unwrap();
    assert_eq!(f.state("k").await, None, "the key is released");
    let runs = Arc::new(AtomicUsize::new(0));
    f.charge("k", &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.rows().await, vec!["k".to_owned()]);
}

/// The work cannot commit, roll back or release the savepoint it runs in.
#[tokio::test]
async fn the_work_cannot_end_its_transaction() {
    let f = fixture(Duration::from_secs(60)).await;
    for (i, sql) in [
        "COMMIT",
        "ROLLBACK",
        "BEGIN",
        "RELEASE idem_work",
        "ROLLBACK TO idem_work",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("k-{i}");
        let refused: Result<(), Error<rusqlite::Error>> = f
            .store
            .execute_in_batch(&f.idem, &key, "body", move |conn: &Connection| {
                conn.execute("INSERT INTO charges VALUES ('x', 1)", [])?;
                conn.execute_batch(sql)
            })
            .await;
        match refused {
            Err(Error::Work(error)) => assert!(
                error.to_string().contains("authoriz") || error.to_string().contains("prohibited"),
                "{sql}: {error}"
            ),
            other => panic!("{sql}: expected the work's error, got {other:?}"),
        }
        assert!(f.rows().await.is_empty(), "{sql}");
        assert_eq!(f.state(&key).await, None, "{sql}");
    }
    // A savepoint of the work's own is fine.
    f.store
        .execute_in_batch(&f.idem, "nested", "body", |conn: &Connection| {
            conn.execute_batch(
                "SAVEPOINT mine; INSERT INTO charges VALUES ('nested', 1); RELEASE mine",
            )
        })
        .await
        .unwrap();
    assert_eq!(f.rows().await, vec!["nested".to_owned()]);
}

/// A panic in the work undoes its rows, keeps the key claimed, reaches the
/// caller, and leaves the writer serving.
#[tokio::test]
async fn a_panic_in_the_work_undoes_its_rows_and_the_store_serves_on() {
    let f = Arc::new(fixture(Duration::from_secs(60)).await);
    let g = Arc::clone(&f);
    let panicked = tokio::spawn(async move {
        g.store
            .execute_in_batch(
                &g.idem,
                "k",
                "body",
                |conn: &Connection| -> Result<(), ()> {
                    conn.execute("INSERT INTO charges VALUES ('k', 1)", [])
                        .unwrap();
                    panic!("the work panicked")
                },
            )
            .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert!(f.rows().await.is_empty());
    assert_eq!(f.state("k").await, Some(State::InFlight));
    let runs = Arc::new(AtomicUsize::new(0));
    f.charge("other", &runs).await.unwrap();
    assert_eq!(f.rows().await, vec!["other".to_owned()]);
}

/// Regression guard for durability: a reopened file holds the rows and the
/// outcomes that were reported.
#[tokio::test]
async fn a_reopened_file_keeps_rows_and_outcomes() {
    let (store, dir, path) = support::fresh().await;
    let idem = Idempotent::new(store.clone());
    store
        .execute_in_batch(&idem, "schema", &(), |conn| {
            conn.execute_batch("CREATE TABLE charges (key TEXT PRIMARY KEY, amount INTEGER)")
        })
        .await
        .unwrap();
    let id: i64 = store
        .execute_in_batch(&idem, "order-1", "body", |conn: &Connection| {
            conn.execute("INSERT INTO charges VALUES ('order-1', 1)", [])?;
            Ok::<_, rusqlite::Error>(conn.last_insert_rowid())
        })
        .await
        .unwrap();
    drop((idem, store));
    let store = SqliteStore::open(&path).await.unwrap();
    let idem = Idempotent::new(store.clone());
    let replayed: i64 = store
        .execute_in_batch(&idem, "order-1", "body", |_: &Connection| {
            Ok::<_, rusqlite::Error>(-1)
        })
        .await
        .unwrap();
    assert_eq!(replayed, id);
    drop(dir);
}

/// A remembered failure commits with the work's rows, in its savepoint, and
/// every retry gets it back without running; other errors still release.
#[tokio::test]
async fn a_remembered_failure_commits_with_its_rows_and_replays_without_running() {
    let f = fixture(Duration::from_secs(60)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = |key: &'static str, amount: i64| {
        let runs = Arc::clone(&runs);
        let f = &f;
        async move {
            f.store
                .execute_in_batch_remembering(
                    &f.idem,
                    key,
                    &amount,
                    |e: &String| e.starts_with("declined"),
                    move |conn: &Connection| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        conn.execute("INSERT INTO charges VALUES (?1, ?2)", (key, amount))
                            .map_err(|e| e.to_string())?;
                        match amount {
                            a if a > 100 => Err(format!("declined: {a}")),
                            a if a < 0 => Err("bad amount".to_owned()),
                            a => Ok(a),
                        }
                    },
                )
                .await
        }
    };
    for _ in 0..3 {
        let declined = attempt("big", 500).await;
        assert!(
            matches!(&declined, Err(Error::Work(e)) if e == "declined: 500"),
            "{declined:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.state("big").await, Some(State::Failed));
    assert_eq!(f.rows().await, vec!["big".to_owned()]);

    let bad = attempt("neg", -1).await;
    assert!(matches!(&bad, Err(Error::Work(e)) if e == "bad amount"));
    assert_eq!(f.state("neg").await, None);
    assert_eq!(f.rows().await, vec!["big".to_owned()]);

    assert_eq!(attempt("ok", 5).await.unwrap(), 5);
    assert_eq!(attempt("ok", 5).await.unwrap(), 5);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(f.rows().await, vec!["big".to_owned(), "ok".to_owned()]);
}
