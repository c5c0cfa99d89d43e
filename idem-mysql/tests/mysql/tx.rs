//! Transactional completion: the conformance kit's transaction cases
//! (business rows and the outcome commit together, a stale owner's writes
//! never land, remembered failures replay, misuse is refused) on a
//! business table of their own, and what only MariaDB needs: a
//! transaction ended behind sqlx's back, and the round trips counted.

use std::future::Future;

use idem_core::store::{State, Store, StoreError, StoreErrorKind, StoreTx, TxFuture};
use idem_core::{Begin, Error, Fingerprint, Idempotent, Lease};
use idem_mysql::sqlx::mysql::MySql;
use idem_mysql::sqlx::{self, MySqlConnection, Transaction};
use idem_mysql::MySqlStore;
use idem_testing::Cleanup;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::support::{self, DropGuard};

/// A store and a business table of its own, dropped with it.
struct Charges {
    store: MySqlStore,
    charges: String,
    _guards: (Cleanup, Cleanup),
}

async fn charges() -> Option<Charges> {
    let (store, table_guard) = support::store().await?;
    let charges = support::unique_name("charges");
    sqlx::raw_sql(&format!(
        "CREATE TABLE {charges} (`key` VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL) \
         ENGINE = InnoDB"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    Some(Charges {
        _guards: (table_guard, DropGuard::table(&charges)),
        store,
        charges,
    })
}

idem_conformance::tx_tests!(charges);

/// A transaction on the store's pool that settles through `complete_in`
/// and `fail_in`.
struct CompleteIn {
    store: MySqlStore,
    tx: Transaction<'static, MySql>,
}

impl StoreTx for CompleteIn {
    type Conn = MySqlConnection;

    fn conn(&mut self) -> &mut MySqlConnection {
        &mut self.tx
    }

    async fn settle(&mut self, lease: &Lease, state: State, payload: &[u8]) -> Result<(), Error> {
        match state {
            State::Failed => self.store.fail_in(&mut self.tx, lease, payload).await,
            _ => self.store.complete_in(&mut self.tx, lease, payload).await,
        }
    }

    async fn commit(self) -> Result<(), StoreError> {
        self.tx
            .commit()
            .await
            .map_err(|e| StoreError::backend("mysql", e))
    }

    async fn rollback(self) {
        let _ = self.tx.rollback().await;
    }
}

impl idem_conformance::tx::TxStore for Charges {
    type Store = MySqlStore;
    type Conn = MySqlConnection;
    type Tx = CompleteIn;

    fn store(&self) -> &MySqlStore {
        &self.store
    }

    async fn open(&self) -> CompleteIn {
        let tx = self.store.pool().begin().await.unwrap();
        CompleteIn {
            store: self.store.clone(),
            tx,
        }
    }

    fn insert(&self, key: &str, amount: i64) -> String {
        format!(
            "INSERT INTO {} (`key`, amount) VALUES ('{key}', {amount})",
            self.charges
        )
    }

    fn run(conn: &mut MySqlConnection, statement: String) -> TxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            sqlx::query(&statement)
                .execute(&mut *conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    }

    async fn rows(&self) -> Vec<String> {
        let sql = format!("SELECT `key` FROM {} ORDER BY `key`", self.charges);
        sqlx::query_scalar(&sql)
            .fetch_all(self.store.pool())
            .await
            .unwrap()
    }

    fn usurp(&self) -> TxFuture<'static, ()> {
        let (pool, table) = (self.store.pool().clone(), self.store.table());
        Box::pin(async move {
            sqlx::query(&format!("UPDATE `{table}` SET token = REPEAT(X'00', 16)"))
                .execute(&pool)
                .await
                .unwrap();
        })
    }

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
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> TxFuture<'c, Result<T, E>> + Send + 'static,
    {
        self.store.execute_in_tx(idem, key, body, work)
    }

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
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> TxFuture<'c, Result<T, E>> + Send + 'static,
    {
        self.store
            .execute_in_tx_remembering(idem, key, body, remember, work)
    }

    async fn complete_outside_a_transaction(&self, lease: &Lease) -> Result<(), Error> {
        let mut conn = self.store.pool().acquire().await.unwrap();
        self.store.complete_in(&mut conn, lease, b"1").await
    }

    async fn complete_on_another_database(&self, lease: &Lease) -> Result<(), Error> {
        let other = support::unique_name("idem_other_db");
        sqlx::raw_sql(&format!("CREATE DATABASE {other}"))
            .execute(self.store.pool())
            .await
            .unwrap();
        let _db = DropGuard::database(&other);
        let url = support::url();
        let other_url = format!("{}/{other}", &url[..url.rfind('/').unwrap()]);
        // A pool, not a lone connection: its futures are `Send` for any
        // borrow, as this trait's futures must be.
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&other_url)
            .await
            .unwrap();
        // The same table in the other database, so only the check can tell.
        let ours = self.store.pool().connect_options();
        let ours = ours.get_database().unwrap();
        let table = self.store.table();
        sqlx::raw_sql(&format!(
            "CREATE TABLE {other}.`{table}` LIKE {ours}.`{table}`"
        ))
        .execute(&pool)
        .await
        .unwrap();
        let mut tx = pool.begin().await.unwrap();
        let completed = self.store.complete_in(&mut tx, lease, b"1").await;
        tx.rollback().await.unwrap();
        pool.close().await;
        completed
    }
}

impl Charges {
    async fn lease(&self, idem: &Idempotent, key: &str) -> Lease {
        match idem.begin(key, Fingerprint::of_bytes(b"b")).await.unwrap() {
            Begin::Run(lease) => lease,
            other => panic!("expected to run, got {other:?}"),
        }
    }

    async fn state(&self, idem: &Idempotent, key: &str) -> Option<State> {
        let key = idem.key(key).unwrap();
        let record = self.store.load(key.as_str()).await.unwrap();
        record.map(|r| r.state)
    }
}

/// Regression guard: a raw `COMMIT` inside the work ends the transaction
/// behind sqlx's back; the fence (`@@in_transaction`) refuses to record the
/// outcome in autocommit, with an error that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_ended_behind_sqlx_is_refused() {
    let Some(f) = charges().await else {
        return;
    };
    let idem = Idempotent::new(f.store.clone());
    let lease = f.lease(&idem, "k").await;
    let mut tx = f.store.pool().begin().await.unwrap();
    sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await.unwrap();
    match f.store.complete_in(&mut tx, &lease, b"1").await {
        Err(Error::Store { source, .. }) => {
            assert_eq!(source.kind(), StoreErrorKind::Config, "{source}");
            assert!(
                source.to_string().contains("no transaction open"),
                "{source}"
            );
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    drop(tx);
    assert_eq!(f.state(&idem, "k").await, Some(State::InFlight));

    let sql = idem_conformance::tx::TxStore::insert(&f, "c", 1);
    let committed: Result<i64, Error<sqlx::Error>> = f
        .store
        .execute_in_tx(&idem, "c", "body", move |tx| {
            Box::pin(async move {
                sqlx::query(&sql).execute(&mut *tx).await?;
                sqlx::query("COMMIT").execute(&mut *tx).await?;
                Ok(1)
            })
        })
        .await;
    match committed {
        Err(Error::Store { source, .. }) => {
            assert_eq!(source.kind(), StoreErrorKind::Config, "{source}")
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    assert_ne!(f.state(&idem, "c").await, Some(State::Completed));
}

/// The round trips of a transactional first execution, counted by the
/// server: claim, BEGIN, the business insert, the fenced update, COMMIT —
/// the raw protocol's own statements, none added; a replay is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_first_execution_adds_no_round_trip() {
    let Some(f) = charges().await else {
        return;
    };
    // One connection, so the session's own counters see every statement.
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&support::url())
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool.clone())
        .with_table(&f.store.table())
        .unwrap();
    let idem = Idempotent::new(store.clone());
    let questions = || async {
        let row: (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Questions'")
            .fetch_one(&pool)
            .await
            .unwrap();
        row.1.parse::<i64>().unwrap()
    };
    let charge = |key: &'static str| {
        let sql = idem_conformance::tx::TxStore::insert(&f, key, 1);
        let (store, idem) = (store.clone(), idem.clone());
        async move {
            store
                .execute_in_tx(&idem, key, &1, move |tx| {
                    Box::pin(async move {
                        sqlx::query(&sql).execute(&mut *tx).await?;
                        Ok::<_, sqlx::Error>(1)
                    })
                })
                .await
                .unwrap()
        }
    };
    // Warm the statement cache, so preparing is not counted.
    charge("warm").await;
    let before = questions().await;
    charge("first").await;
    let first = questions().await - before - 1;
    let before = questions().await;
    charge("first").await;
    let replay = questions().await - before - 1;
    // Questions counts each executed statement (prepared or text), not
    // the PREPARE itself once cached.
    assert_eq!((first, replay), (5, 1), "first, replay");
}
