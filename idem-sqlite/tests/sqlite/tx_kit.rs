//! The conformance kit's transaction cases on `SqliteTx`, the transaction
//! shape the three SQL stores share: business rows and the outcome commit
//! together, a rolled-back or dropped completion gives the key back, a
//! transaction of another store is refused. The cases that write while a
//! transaction is open are left out (`single_writer`): here they wait for
//! its end instead of racing it.

use std::future::Future;

use idem_conformance::tx::TxStore;
use idem_core::store::{State, StoreTx, TxFuture, Uncommitted};
use idem_core::{Error, Idempotent, Lease};
use idem_sqlite::{SqliteStore, SqliteTx};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tempfile::TempDir;

use crate::support;

/// A store on a file of its own and its business table, `charges`.
struct Charges {
    store: SqliteStore,
    _dir: TempDir,
}

async fn charges() -> Option<Charges> {
    let (store, dir, _) = support::fresh().await;
    let mut tx = store.begin().await.unwrap();
    tx.call(|conn| {
        conn.execute_batch("CREATE TABLE charges (key TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
    })
    .await
    .unwrap();
    tx.commit().await.unwrap();
    Some(Charges { store, _dir: dir })
}

/// A transaction on the store that settles through `complete_in` and
/// `fail_in`.
struct CompleteIn {
    store: SqliteStore,
    tx: SqliteTx,
}

impl StoreTx for CompleteIn {
    type Conn = SqliteTx;

    const HOLDS_THE_WRITER: bool = true;

    fn conn(&mut self) -> &mut SqliteTx {
        &mut self.tx
    }

    async fn settle(&mut self, lease: &Lease, state: State, payload: &[u8]) -> Result<(), Error> {
        // The kit ends the transaction and settles the key itself, so the
        // guard hands the lease straight back.
        let lease = lease.clone();
        let done = match state {
            State::Failed => self.store.fail_in(&mut self.tx, lease, payload).await,
            _ => self.store.complete_in(&mut self.tx, lease, payload).await,
        };
        done.map(|done| drop(done.into_lease()))
    }

    async fn commit(self) -> Result<(), idem_core::store::StoreError> {
        self.tx.commit().await
    }

    async fn rollback(self) {
        let _ = self.tx.rollback().await;
    }
}

impl TxStore for Charges {
    type Store = SqliteStore;
    type Conn = SqliteTx;
    type Tx = CompleteIn;

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    async fn open(&self) -> CompleteIn {
        CompleteIn {
            store: self.store.clone(),
            tx: self.store.begin().await.unwrap(),
        }
    }

    fn insert(&self, key: &str, amount: i64) -> String {
        format!("INSERT INTO charges (key, amount) VALUES ('{key}', {amount})")
    }

    fn run(conn: &mut SqliteTx, statement: String) -> TxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            conn.call(move |conn| conn.execute_batch(&statement))
                .await
                .map_err(|e| e.to_string())
        })
    }

    async fn rows(&self) -> Vec<String> {
        let mut tx = self.store.begin().await.unwrap();
        let rows = tx
            .call(|conn| {
                let mut select = conn.prepare("SELECT key FROM charges ORDER BY key")?;
                let keys = select.query_map([], |row| row.get(0))?;
                keys.collect::<rusqlite::Result<Vec<String>>>()
            })
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        rows
    }

    fn usurp(&self) -> TxFuture<'static, ()> {
        // Only the cases `single_writer` leaves out call it: run while a
        // transaction is open, it would wait for that transaction's end.
        let store = self.store.clone();
        Box::pin(async move {
            let mut tx = store.begin().await.unwrap();
            tx.call(|conn| conn.execute_batch("UPDATE idem_records SET token = zeroblob(16)"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
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
        F: for<'c> FnOnce(&'c mut SqliteTx) -> TxFuture<'c, Result<T, E>> + Send + 'static,
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
        F: for<'c> FnOnce(&'c mut SqliteTx) -> TxFuture<'c, Result<T, E>> + Send + 'static,
    {
        self.store
            .execute_in_tx_remembering(idem, key, body, remember, work)
    }

    async fn complete_outside_a_transaction(&self, _lease: &Lease) -> Result<(), Error> {
        unreachable!("a SqliteTx is a transaction until it ends, and then it is gone")
    }

    async fn complete_on_another_database(&self, lease: &Lease) -> Result<(), Error> {
        // Another file, holding the same table: only the check can tell.
        let (other, _dir, _) = support::fresh().await;
        let mut tx = other.begin().await.unwrap();
        let completed = self.store.complete_in(&mut tx, lease.clone(), b"1").await;
        tx.rollback().await.unwrap();
        completed.map(|done| drop(done.into_lease()))
    }

    fn complete_in<'a>(
        tx: &'a mut CompleteIn,
        lease: Lease,
        payload: &'a [u8],
    ) -> impl Future<Output = Result<Uncommitted, Error>> + Send + 'a {
        tx.store.complete_in(&mut tx.tx, lease, payload)
    }
}

idem_conformance::tx_tests!(single_writer: charges);

/// A panic in a transaction's statements rolls it back, reaches the
/// caller, and leaves the writer serving the next transaction.
#[tokio::test]
async fn a_panic_in_a_statement_rolls_the_transaction_back() {
    let db = charges().await.unwrap();
    let store = db.store.clone();
    let panicked = tokio::spawn(async move {
        let mut tx = store.begin().await.unwrap();
        tx.call(|conn| conn.execute_batch("INSERT INTO charges VALUES ('k', 1)"))
            .await
            .unwrap();
        tx.call(|_| -> rusqlite::Result<()> { panic!("a statement panicked") })
            .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert!(db.rows().await.is_empty());
}

/// The statements of a transaction cannot end it: SQLite refuses, and the
/// transaction still commits what it wrote.
#[tokio::test]
async fn a_statement_cannot_end_its_transaction() {
    let db = charges().await.unwrap();
    let mut tx = db.store.begin().await.unwrap();
    tx.call(|conn| conn.execute_batch("INSERT INTO charges VALUES ('k', 1)"))
        .await
        .unwrap();
    for sql in ["COMMIT", "ROLLBACK", "RELEASE idem_work"] {
        let refused = tx.call(move |conn| conn.execute_batch(sql)).await;
        let error = refused.expect_err(sql).to_string();
        assert!(
            error.contains("authoriz") || error.contains("prohibited"),
            "{sql}: {error}"
        );
    }
    tx.commit().await.unwrap();
    assert_eq!(db.rows().await, ["k"]);
}
