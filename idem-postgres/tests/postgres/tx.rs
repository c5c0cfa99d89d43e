//! Transactional completion: the conformance kit's transaction cases
//! (business rows and the outcome commit together, a stale owner's writes
//! never land, misuse is refused) on a business table of their own.

use std::future::Future;

use idem_core::store::{State, StoreError, StoreTx, TxFuture};
use idem_core::{Error, Idempotent, Lease};
use idem_postgres::sqlx::postgres::Postgres;
use idem_postgres::sqlx::{self, PgConnection, Transaction};
use idem_postgres::PostgresStore;
use idem_testing::Cleanup;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::support;

/// A store and a business table of its own, dropped with it.
struct Charges {
    store: PostgresStore,
    charges: String,
    _guards: (Cleanup, Cleanup),
}

async fn charges() -> Option<Charges> {
    let (store, table_guard) = support::store().await?;
    let charges = support::unique_name("charges");
    sqlx::raw_sql(&format!(
        "CREATE TABLE {charges} (key text PRIMARY KEY, amount int8 NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    Some(Charges {
        _guards: (table_guard, support::drop_table(&charges)),
        store,
        charges,
    })
}

idem_conformance::tx_tests!(charges);

/// A transaction on the store's pool that settles through `complete_in`
/// and `fail_in`.
struct CompleteIn {
    store: PostgresStore,
    tx: Transaction<'static, Postgres>,
}

impl StoreTx for CompleteIn {
    type Conn = PgConnection;

    fn conn(&mut self) -> &mut PgConnection {
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
            .map_err(|e| StoreError::backend("postgres", e))
    }

    async fn rollback(self) {
        let _ = self.tx.rollback().await;
    }
}

impl idem_conformance::tx::TxStore for Charges {
    type Store = PostgresStore;
    type Conn = PgConnection;
    type Tx = CompleteIn;

    fn store(&self) -> &PostgresStore {
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
            "INSERT INTO {} (key, amount) VALUES ('{key}', {amount})",
            self.charges
        )
    }

    fn run(conn: &mut PgConnection, statement: String) -> TxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            sqlx::query(&statement)
                .execute(&mut *conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    }

    async fn rows(&self) -> Vec<String> {
        let sql = format!("SELECT key FROM {} ORDER BY key", self.charges);
        sqlx::query_scalar(&sql)
            .fetch_all(self.store.pool())
            .await
            .unwrap()
    }

    fn usurp(&self) -> TxFuture<'static, ()> {
        let (pool, table) = (self.store.pool().clone(), self.store.table());
        Box::pin(async move {
            sqlx::query(&format!(
                "UPDATE \"{table}\" SET token = '\\x00000000000000000000000000000000'"
            ))
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
        F: for<'c> FnOnce(&'c mut PgConnection) -> TxFuture<'c, Result<T, E>> + Send + 'static,
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
        F: for<'c> FnOnce(&'c mut PgConnection) -> TxFuture<'c, Result<T, E>> + Send + 'static,
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
        let _db = support::drop_database(&other);
        let url = support::url();
        let other_url = format!("{}/{other}", &url[..url.rfind('/').unwrap()]);
        // A pool, not a lone connection: its futures are `Send` for any
        // borrow, as this trait's futures must be.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&other_url)
            .await
            .unwrap();
        // The same table in the other database, so only the check can tell.
        sqlx::raw_sql(&format!(
            "CREATE TABLE \"{}\" (key text COLLATE \"C\" PRIMARY KEY, token bytea NOT NULL, \
             fingerprint bytea NOT NULL, state smallint NOT NULL, payload bytea NOT NULL, \
             lease_until timestamptz, retain_until timestamptz NOT NULL)",
            self.store.table()
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
