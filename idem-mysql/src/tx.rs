//! Transactional completion: the outcome recorded by a token-fenced update
//! inside the transaction that holds the work's own writes.
//!
//! The policy (claim, open, run, record, commit; what is released and what
//! the caller is told) is idem-core's
//! [`execute_in_store_tx`](idem_core::Idempotent::execute_in_store_tx),
//! shared with the other SQL stores; this file supplies MariaDB's
//! transaction and runs the fenced update that `schema.rs` builds.

use std::future::Future;

use idem_core::store::{State, StoreError, StoreTx, Uncommitted};
use idem_core::{Error, Idempotent, Lease, When};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::{Connection, Row, Transaction};

use crate::error::error;
use crate::store::bind_record;
use crate::{MySqlStore, BACKEND};

/// The future a transactional work closure returns (defined in idem-core,
/// shared by every SQL store): write `|tx| Box::pin(async move { … })`.
pub use idem_core::store::TxFuture;

impl MySqlStore {
    /// Opens a transaction on the store's pool, for business writes whose
    /// outcome [`complete_in`](MySqlStore::complete_in) records inside it:
    /// the same call as on the other SQL stores (`SqliteStore::begin`,
    /// `PostgresStore::begin`). Unlike a bare `pool.begin()`, a caller dropped
    /// while the `BEGIN` is on its way leaves no transaction open on a
    /// pooled connection.
    pub async fn begin(&self) -> Result<Transaction<'static, MySql>, StoreError> {
        idem_sql::begin(self.pool()).await.map_err(error)
    }

    /// Records `payload` as the lease's `Completed` outcome **inside** the
    /// open transaction on `tx`, fenced by the lease's token, in one
    /// statement. Commit the transaction afterwards: the outcome becomes
    /// durable together with every business write made in it, or, on
    /// rollback, neither does.
    ///
    /// Pass the transaction's connection (`&mut *tx` for a
    /// `sqlx::Transaction`). It may come from any pool on the store's
    /// server: the update names the store's table (in the connection's
    /// database, unless the table name gives one).
    ///
    /// End the transaction through the [`Uncommitted`] this returns,
    /// `done.commit(tx.commit())` or `done.rollback(tx.rollback())`; a
    /// rollback, or dropping both (the `Uncommitted` then releases in a
    /// spawned task once the transaction ended), gives the key back. Neither
    /// the outcome nor the writes landed then, so the release (fenced by the
    /// token and the in-flight state) lets a retry run at once, as a failed
    /// `execute_in_tx` does, and the lease is taken by value so that it
    /// cannot be completed outside the transaction that rolled back.
    ///
    /// ```no_run
    /// use std::convert::Infallible;
    ///
    /// use idem_core::BeginJson;
    /// use idem_mysql::MySqlStore;
    ///
    /// # async fn run(store: MySqlStore, idem: idem_core::Idempotent)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let BeginJson::Run(lease) = idem.begin_json::<_, i64, Infallible>("order-7f3a", &1250).await? else {
    ///     return Ok(()); // replayed
    /// };
    /// let mut tx = store.begin().await?;
    /// // … the business writes, through `&mut *tx` …
    /// let done = store.complete_in(&mut tx, lease, b"1250").await?;
    /// done.commit(tx.commit()).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// On an error the lease is dropped and the key stays claimed until it
    /// lapses: nothing was recorded, and writes the caller commits
    /// regardless would run twice if a retry could run at once.
    ///
    /// * [`Error::LeaseLost`]: the lease was taken over, or was already
    ///   settled (completed, failed or released) — nothing was written, and
    ///   the transaction **must be rolled back**, so that the business writes
    ///   of a stale owner never land.
    /// * A [config](idem_core::store::StoreErrorKind::Config) store error, nothing
    ///   recorded: `tx` is not inside a transaction opened through sqlx, or
    ///   the server has no transaction open on it (InnoDB rolled it back to
    ///   break a deadlock, or a raw `COMMIT`/`ROLLBACK` ended it), or, for
    ///   an unqualified table name, the connection's database is not the
    ///   store's.
    /// * A backend store error: the statement failed; roll back.
    ///
    /// Only a refusal costs a second statement (to tell the causes apart);
    /// a completion is one round trip. The heartbeat ([`Lease::heartbeat`])
    /// renews through the store's pool, so it needs a second connection
    /// from it while the transaction is open.
    pub async fn complete_in(
        &self,
        tx: &mut MySqlConnection,
        lease: Lease,
        payload: &[u8],
    ) -> Result<Uncommitted, Error> {
        self.settle_in(tx, &lease, State::Completed, payload)
            .await?;
        Ok(Uncommitted::new(lease))
    }

    /// Like [`complete_in`](MySqlStore::complete_in), but records the
    /// payload as a remembered failure (`Failed`), replayed to every retry.
    pub async fn fail_in(
        &self,
        tx: &mut MySqlConnection,
        lease: Lease,
        payload: &[u8],
    ) -> Result<Uncommitted, Error> {
        self.settle_in(tx, &lease, State::Failed, payload).await?;
        Ok(Uncommitted::new(lease))
    }

    async fn settle_in(
        &self,
        tx: &mut MySqlConnection,
        lease: &Lease,
        state: State,
        payload: &[u8],
    ) -> Result<(), Error> {
        if !tx.is_in_transaction() {
            return Err(misuse(
                "complete_in and fail_in must run inside a transaction opened through sqlx \
                 (pool.begin() or conn.begin()); nothing was recorded",
            ));
        }
        let record = lease.record(state, payload);
        let token = lease.token();
        let after_work = |e| Error::Store {
            source: error(e),
            when: When::AfterWork,
        };
        // No deadlock rerun here: a deadlock victim inside a transaction
        // loses the whole transaction, business writes included.
        let done = bind_record(sqlx::query(&self.statements().complete_in), &record)
            .bind(lease.key().as_str())
            .bind(&token.as_bytes()[..])
            .execute(&mut *tx)
            .await
            .map_err(after_work)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        // Nothing matched: a lost lease, or one of the misuses the fence
        // also refuses. One more statement tells them apart.
        let row = sqlx::query("SELECT CAST(@@in_transaction AS SIGNED), DATABASE()")
            .fetch_one(&mut *tx)
            .await
            .map_err(after_work)?;
        let open: i64 = row.try_get(0).map_err(after_work)?;
        let database: Option<String> = row.try_get(1).map_err(after_work)?;
        if open != 1 {
            return Err(misuse(
                "the server has no transaction open on this connection (InnoDB rolled it \
                 back to break a deadlock, or a raw COMMIT or ROLLBACK ended it); \
                 nothing was recorded, and writes made before it ended are not covered",
            ));
        }
        let qualified = self.table().contains('.');
        match self.pool().connect_options().get_database() {
            Some(ours) if !qualified && database.as_deref() != Some(ours) => Err(misuse(&format!(
                "the transaction is on database {database:?} but the store's is {ours:?}; \
                 nothing was recorded"
            ))),
            _ => Err(Error::LeaseLost),
        }
    }

    /// Runs `work` exactly once for `key` and `body` **inside a transaction
    /// on this store's pool**, records its outcome in that same transaction,
    /// and replays the outcome to every retry.
    ///
    /// The claim commits on its own first (other callers must see it). Then
    /// a transaction opens, `work` gets its connection and makes its
    /// business writes, the token-fenced completion runs in the
    /// transaction, and one commit makes the writes and the outcome durable
    /// together. A crash anywhere leaves both or neither: a retry then
    /// replays the outcome, or (once the lease lapses) runs the work again
    /// on a database that never saw the first attempt's writes. Business
    /// tables must be transactional (InnoDB): a write to a MyISAM or
    /// Aria table commits on its own whatever happens to the transaction.
    ///
    /// * `Ok(value)` is recorded and returned after the commit.
    /// * `Err(e)` rolls the business writes back, releases the key and
    ///   returns [`Error::Work`]; a retry runs the work again.
    /// * A caller whose lease was taken over while the work ran gets
    ///   [`Error::LeaseLost`], and its transaction rolls back: a stale
    ///   owner's business writes never land.
    /// * A failed commit is [`Error::Store`] with [`When::AfterWork`]; the
    ///   outcome and the writes landed together or not at all, and the key
    ///   is released when nothing landed.
    ///
    /// `idem` must claim keys in this store. The closure receives the
    /// transaction's connection, not the transaction, so it cannot commit
    /// what it does not own through sqlx; a raw `COMMIT` it sends is caught
    /// by the fence (see [`complete_in`](MySqlStore::complete_in)). The
    /// policy is idem-core's
    /// [`execute_in_store_tx`](Idempotent::execute_in_store_tx), the same
    /// on every SQL store.
    ///
    /// ```no_run
    /// use idem_core::{Error, Idempotent};
    /// use idem_mysql::MySqlStore;
    ///
    /// # async fn run(store: MySqlStore) -> Result<(), Error<sqlx::Error>> {
    /// let idem = Idempotent::new(store.clone());
    /// let order = serde_json::json!({"amount": 1250, "currency": "EUR"});
    /// let charge: u64 = store
    ///     .execute_in_tx(&idem, "order-7f3a", &order, |tx| {
    ///         Box::pin(async move {
    ///             let done = sqlx::query("INSERT INTO charges (amount) VALUES (1250)")
    ///                 .execute(&mut *tx)
    ///                 .await?;
    ///             Ok(done.last_insert_id())
    ///         })
    ///     })
    ///     .await?;
    /// # let _ = charge;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn execute_in_tx<B, T, E, F>(
        &self,
        idem: &Idempotent,
        key: &str,
        body: &B,
        work: F,
    ) -> Result<T, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Send,
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> TxFuture<'c, Result<T, E>> + Send,
    {
        idem.execute_in_store_tx(key, body, || self.open_tx(), work)
            .await
    }

    /// Like [`execute_in_tx`](MySqlStore::execute_in_tx), but a work error
    /// for which `remember` returns `true` is recorded as a remembered
    /// failure **in the work's transaction** (with
    /// [`fail_in`](MySqlStore::fail_in)), and every retry gets it back as
    /// [`Error::Work`] without running — what
    /// [`Idempotent::execute_remembering`] does outside transactions.
    ///
    /// The work's writes made before it returned the remembered error
    /// commit with the failure; undo them in a savepoint of your own if
    /// they must not stay. If the failure cannot be recorded (the fenced
    /// update or the commit fails), the writes roll back, the key is
    /// released and the caller still gets [`Error::Work`].
    pub async fn execute_in_tx_remembering<B, T, E, R, F>(
        &self,
        idem: &Idempotent,
        key: &str,
        body: &B,
        remember: R,
        work: F,
    ) -> Result<T, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Serialize + DeserializeOwned + Send,
        R: FnOnce(&E) -> bool + Send,
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> TxFuture<'c, Result<T, E>> + Send,
    {
        idem.execute_in_store_tx_remembering(key, body, remember, || self.open_tx(), work)
            .await
    }

    async fn open_tx(&self) -> Result<MySqlTx<'_>, StoreError> {
        let tx = idem_sql::begin(self.pool()).await.map_err(error)?;
        Ok(MySqlTx { store: self, tx })
    }
}

/// A transaction on the store's pool, as the shared driver in idem-core
/// runs it.
struct MySqlTx<'s> {
    store: &'s MySqlStore,
    tx: Transaction<'static, MySql>,
}

impl StoreTx for MySqlTx<'_> {
    type Conn = MySqlConnection;

    fn conn(&mut self) -> &mut MySqlConnection {
        &mut self.tx
    }

    fn settle<'a>(
        &'a mut self,
        lease: &'a Lease,
        state: State,
        payload: &'a [u8],
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        self.store.settle_in(&mut self.tx, lease, state, payload)
    }

    async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await.map_err(error)
    }

    async fn rollback(self) {
        let _ = self.tx.rollback().await;
    }
}

fn misuse<E>(why: &str) -> Error<E> {
    Error::Store {
        source: StoreError::config(BACKEND, why.to_owned()),
        when: When::AfterWork,
    }
}
