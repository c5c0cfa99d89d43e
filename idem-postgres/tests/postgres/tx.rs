//! Transactional completion: business rows and the outcome commit together,
//! a stale owner's writes never land, and misuse is refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{State, Store, StoreErrorKind};
use idem_core::{Begin, Error, Fingerprint, Idempotent};
use idem_postgres::sqlx::{self, Connection, PgConnection};
use idem_postgres::PostgresStore;

use crate::support;
use idem_testing::Cleanup;

/// A store, an `Idempotent` on it, and a business table of its own.
struct Fixture {
    store: PostgresStore,
    idem: Idempotent,
    charges: String,
    _guards: (Cleanup, Cleanup),
}

async fn fixture(lease: Duration) -> Option<Fixture> {
    let (store, table_guard) = support::store().await?;
    let charges = support::unique_name("charges");
    sqlx::raw_sql(&format!(
        "CREATE TABLE {charges} (key text PRIMARY KEY, amount int8 NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let idem = Idempotent::new(store.clone()).with_lease(lease);
    Some(Fixture {
        _guards: (table_guard, support::drop_table(&charges)),
        store,
        idem,
        charges,
    })
}

impl Fixture {
    async fn rows(&self) -> i64 {
        let (n,): (i64,) = sqlx::query_as(&format!("SELECT count(*) FROM {}", self.charges))
            .fetch_one(self.store.pool())
            .await
            .unwrap();
        n
    }

    /// Charges `amount` under `key` in the same transaction as its outcome.
    async fn charge(
        &self,
        key: &str,
        amount: i64,
        runs: &Arc<AtomicUsize>,
    ) -> Result<i64, Error<sqlx::Error>> {
        let (sql, key_owned, runs) = (
            format!("INSERT INTO {} (key, amount) VALUES ($1, $2)", self.charges),
            key.to_owned(),
            Arc::clone(runs),
        );
        self.store
            .execute_in_tx(&self.idem, key, &amount, move |tx| {
                Box::pin(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    sqlx::query(&sql)
                        .bind(key_owned)
                        .bind(amount)
                        .execute(&mut *tx)
                        .await?;
                    Ok(amount)
                })
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

/// The first call writes its row and outcome in one commit; retries replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_rows_and_outcome_commit_together_and_retries_replay() {
    let Some(f) = fixture(Duration::from_secs(60)).await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(f.charge("order-1", 1250, &runs).await.unwrap(), 1250);
    assert_eq!(f.charge("order-1", 1250, &runs).await.unwrap(), 1250);
    assert!(matches!(
        f.charge("order-1", 999, &runs).await,
        Err(Error::Mismatch)
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.rows().await, 1);
    assert_eq!(f.state("order-1").await, Some(State::Completed));
}

/// Many callers race on one key: one business row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_callers_make_one_business_row() {
    let Some(f) = fixture(Duration::from_secs(60)).await else {
        return;
    };
    let f = Arc::new(f);
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (f, runs) = (Arc::clone(&f), Arc::clone(&runs));
            tokio::spawn(async move { f.charge("order-1", 7, &runs).await })
        })
        .collect();
    let mut answered = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(7) => answered += 1,
            Err(Error::InProgress { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(answered >= 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.rows().await, 1);
}

/// An error from the work rolls its writes back and releases the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_error_rolls_back_its_writes_and_releases_the_key() {
    let Some(f) = fixture(Duration::from_secs(60)).await else {
        return;
    };
    let sql = format!("INSERT INTO {} (key, amount) VALUES ('k', 1)", f.charges);
    let failed: Result<i64, Error<&str>> = f
        .store
        .execute_in_tx(&f.idem, "k", "body", move |tx| {
            Box::pin(async move {
                sqlx::query(&sql).execute(&mut *tx).await.unwrap();
                Err("declined")
            })
        })
        .await;
    assert!(matches!(failed, Err(Error::Work("declined"))));
    assert_eq!(f.rows().await, 0);
    assert_eq!(f.state("k").await, None, "the key is released");
    let runs = Arc::new(AtomicUsize::new(0));
    f.charge("k", 1, &runs).await.unwrap();
    assert_eq!(f.rows().await, 1);
}

/// Regression guard for the stale owner: its lease lapsed and the key was
/// taken over while its transaction was open. Its completion matches no
/// row, it gets `LeaseLost`, and its business row never lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_gets_lease_lost_and_its_writes_never_land() {
    let Some(f) = fixture(Duration::from_millis(200)).await else {
        return;
    };
    let stale = f.lease("k").await;
    let mut tx = f.store.pool().begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {} (key, amount) VALUES ('stale', 1)",
        f.charges
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taker = f.lease("k").await;
    assert_ne!(taker.token(), stale.token());
    let lost = f.store.complete_in(&mut tx, &stale, b"1").await;
    assert!(matches!(lost, Err(Error::LeaseLost)), "{lost:?}");
    tx.rollback().await.unwrap();

    let mut tx = f.store.pool().begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {} (key, amount) VALUES ('taker', 2)",
        f.charges
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    f.store.complete_in(&mut tx, &taker, b"2").await.unwrap();
    tx.commit().await.unwrap();
    let keys: Vec<(String,)> = sqlx::query_as(&format!("SELECT key FROM {}", f.charges))
        .fetch_all(f.store.pool())
        .await
        .unwrap();
    assert_eq!(keys, vec![("taker".to_owned(),)]);
}

/// The same through `execute_in_tx`: a takeover while the work runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_in_tx_rolls_back_a_stale_owner() {
    let Some(f) = fixture(Duration::from_secs(60)).await else {
        return;
    };
    let (sql, pool, table) = (
        format!("INSERT INTO {} (key, amount) VALUES ('k', 1)", f.charges),
        f.store.pool().clone(),
        f.store.table(),
    );
    let stale: Result<i64, Error<sqlx::Error>> = f
        .store
        .execute_in_tx(&f.idem, "k", "body", move |tx| {
            Box::pin(async move {
                sqlx::query(&sql).execute(&mut *tx).await?;
                // Another owner takes the key over meanwhile: its token
                // replaces ours, through a connection of its own.
                sqlx::query(&format!(
                    "UPDATE \"{table}\" SET token = '\\x00000000000000000000000000000000'"
                ))
                .execute(&pool)
                .await?;
                Ok(1)
            })
        })
        .await;
    assert!(matches!(stale, Err(Error::LeaseLost)), "{stale:?}");
    assert_eq!(f.rows().await, 0);
    assert_eq!(f.state("k").await, Some(State::InFlight));
}

/// A lease already settled cannot complete again inside a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_used_after_it_was_settled_is_lease_lost() {
    let Some(f) = fixture(Duration::from_secs(60)).await else {
        return;
    };
    let lease = f.lease("k").await;
    lease.complete(b"1").await.unwrap();
    let mut tx = f.store.pool().begin().await.unwrap();
    let again = f.store.complete_in(&mut tx, &lease, b"2").await;
    assert!(matches!(again, Err(Error::LeaseLost)), "{again:?}");
    let released = f.lease("k2").await;
    released.release().await.unwrap();
    let again = f.store.fail_in(&mut tx, &released, b"2").await;
    assert!(matches!(again, Err(Error::LeaseLost)), "{again:?}");
}

/// A connection outside a transaction would commit the outcome alone: it
/// is refused and nothing is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completing_outside_a_transaction_is_refused() {
    let Some(f) = fixture(Duration::from_secs(60)).await else {
        return;
    };
    let lease = f.lease("k").await;
    let mut conn = f.store.pool().acquire().await.unwrap();
    let refused = f.store.complete_in(&mut conn, &lease, b"1").await;
    match refused {
        Err(Error::Store { source, .. }) => {
            assert_eq!(source.kind(), StoreErrorKind::Config);
            assert!(
                source.to_string().contains("inside a transaction"),
                "{source}"
            );
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    assert_eq!(f.state("k").await, Some(State::InFlight));
}

/// A transaction on another database is refused with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_on_another_database_is_refused() {
    let Some(f) = fixture(Duration::from_secs(60)).await else {
        return;
    };
    let other = support::unique_name("idem_other_db");
    sqlx::raw_sql(&format!("CREATE DATABASE {other}"))
        .execute(f.store.pool())
        .await
        .unwrap();
    let _db = support::drop_database(&other);
    let url = support::url();
    let other_url = format!("{}/{other}", &url[..url.rfind('/').unwrap()]);
    let mut conn = PgConnection::connect(&other_url).await.unwrap();
    // The same table in the other database, so only the check can tell.
    sqlx::raw_sql(&format!(
        "CREATE TABLE \"{}\" (key text COLLATE \"C\" PRIMARY KEY, token bytea NOT NULL, \
         fingerprint bytea NOT NULL, state smallint NOT NULL, payload bytea NOT NULL, \
         lease_until timestamptz, retain_until timestamptz NOT NULL)",
        f.store.table()
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let lease = f.lease("k").await;
    let mut tx = conn.begin().await.unwrap();
    match f.store.complete_in(&mut tx, &lease, b"1").await {
        Err(Error::Store { source, .. }) => {
            assert_eq!(source.kind(), StoreErrorKind::Config);
            assert!(source.to_string().contains("database"), "{source}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    tx.rollback().await.unwrap();
    conn.close().await.unwrap();
    assert_eq!(f.state("k").await, Some(State::InFlight));
}

/// The heartbeat renews through another connection while the transaction
/// is open, so work longer than the lease keeps its key and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_keeps_the_lease_while_the_transaction_is_open() {
    let Some(f) = fixture(Duration::from_millis(300)).await else {
        return;
    };
    let f = Arc::new(f);
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = {
        let (f, runs) = (Arc::clone(&f), Arc::clone(&runs));
        let sql = format!("INSERT INTO {} (key, amount) VALUES ('k', 1)", f.charges);
        tokio::spawn(async move {
            f.store
                .execute_in_tx(&f.idem, "k", "body", move |tx| {
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        sqlx::query(&sql).execute(&mut *tx).await?;
                        tokio::time::sleep(Duration::from_millis(1200)).await;
                        Ok::<_, sqlx::Error>(1_i64)
                    })
                })
                .await
        })
    };
    // Others keep being told it is in progress, never taking it over.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let other: Result<i64, Error<sqlx::Error>> = f
            .store
            .execute_in_tx(&f.idem, "k", "body", |_| Box::pin(async { Ok(2) }))
            .await;
        assert!(matches!(other, Err(Error::InProgress { .. })), "{other:?}");
    }
    assert_eq!(slow.await.unwrap().unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.rows().await, 1);
}

/// A remembered failure commits with the work's writes, in its
/// transaction, and every retry gets it back without running; other errors
/// still roll back and release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_failure_commits_with_its_writes_and_replays_without_running() {
    let Some(f) = fixture(Duration::from_secs(60)).await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = |key: &'static str, amount: i64| {
        let (sql, runs) = (
            format!("INSERT INTO {} (key, amount) VALUES ($1, $2)", f.charges),
            Arc::clone(&runs),
        );
        let f = &f;
        async move {
            f.store
                .execute_in_tx_remembering(
                    &f.idem,
                    key,
                    &amount,
                    |e: &String| e.starts_with("declined"),
                    move |tx| {
                        Box::pin(async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            sqlx::query(&sql)
                                .bind(key)
                                .bind(amount)
                                .execute(&mut *tx)
                                .await
                                .map_err(|e| e.to_string())?;
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
    assert_eq!(f.rows().await, 1, "the audit row commits with the failure");

    let bad = attempt("neg", -1).await;
    assert!(matches!(&bad, Err(Error::Work(e)) if e == "bad amount"));
    assert_eq!(f.state("neg").await, None);
    assert_eq!(f.rows().await, 1);

    assert_eq!(attempt("ok", 5).await.unwrap(), 5);
    assert_eq!(attempt("ok", 5).await.unwrap(), 5);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(f.rows().await, 2);
}
