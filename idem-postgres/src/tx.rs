//! Transactional completion: the outcome recorded by a token-fenced update
//! inside the transaction that holds the work's own writes.

use std::future::Future;

use idem_core::store::{State, StoreError, StoreTx, Uncommitted};
use idem_core::{Error, Idempotent, Lease, When};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{Connection, Row, Transaction};

use crate::error::error;
use crate::store::bind_record;
use crate::{PostgresStore, BACKEND};

/// The future a transactional work closure returns (defined in idem-core,
/// shared by every SQL store): write `|tx| Box::pin(async move { … })`.
pub use idem_core::store::TxFuture;

impl PostgresStore {
    /// Opens a transaction on the store's pool, for business writes whose
    /// outcome [`complete_in`](PostgresStore::complete_in) records inside it:
    /// the same call as on the other SQL stores (`SqliteStore::begin`,
    /// `MySqlStore::begin`). Unlike a bare `pool.begin()`, a caller dropped
    /// while the `BEGIN` is on its way leaves no transaction open on a
    /// pooled connection.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        idem_sql::begin(self.pool()).await.map_err(error)
    }

    /// Records `payload` as the lease's `Completed` outcome **inside** the
    /// open transaction on `tx`, fenced by the lease's token. Commit the
    /// transaction afterwards: the outcome becomes durable together with
    /// every business write made in it, or, on rollback, neither does.
    ///
    /// Pass the transaction's connection (`&mut *tx` for a
    /// `sqlx::Transaction`). It may come from any pool on the store's
    /// database: the update touches the store's table.
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
    /// use idem_postgres::PostgresStore;
    ///
    /// # async fn run(store: PostgresStore, idem: idem_core::Idempotent)
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
    ///   written: `tx` is not inside a transaction opened through sqlx (the
    ///   outcome would commit on its own; a raw `BEGIN` is not seen and is
    ///   refused too), or it is connected to another database than the
    ///   store's.
    /// * A backend store error: the statement failed; PostgreSQL has
    ///   aborted the transaction, so it can only roll back.
    ///
    /// The heartbeat ([`Lease::heartbeat`]) renews through the store's
    /// pool, so keep it running while the transaction is open; it needs a
    /// second connection from the pool.
    pub async fn complete_in(
        &self,
        tx: &mut PgConnection,
        lease: Lease,
        payload: &[u8],
    ) -> Result<Uncommitted, Error> {
        self.settle_in(tx, &lease, State::Completed, payload)
            .await?;
        Ok(Uncommitted::new(lease))
    }

    /// Like [`complete_in`](PostgresStore::complete_in), but records the
    /// payload as a remembered failure (`Failed`), replayed to every retry.
    pub async fn fail_in(
        &self,
        tx: &mut PgConnection,
        lease: Lease,
        payload: &[u8],
    ) -> Result<Uncommitted, Error> {
        self.settle_in(tx, &lease, State::Failed, payload).await?;
        Ok(Uncommitted::new(lease))
    }

    async fn settle_in(
        &self,
        tx: &mut PgConnection,
        lease: &Lease,
        state: State,
        payload: &[u8],
    ) -> Result<(), Error> {
        // An outcome written outside a transaction would commit on its
        // own, before and apart from the business writes. sqlx counts the
        // transactions it opened on the connection; a raw `BEGIN` is not
        // counted and so is refused too, which is safe.
        if !tx.is_in_transaction() {
            return Err(misuse(
                "complete_in and fail_in must run inside a transaction opened through sqlx \
                 (pool.begin() or conn.begin()); nothing was recorded",
            ));
        }
        let record = lease.record(state, payload);
        let token = lease.token();
        let query = sqlx::query(&self.statements().complete_in)
            .bind(lease.key().as_str())
            .bind(&token.as_bytes()[..]);
        let row = bind_record(query, &record)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| Error::Store {
                source: error(e),
                when: When::AfterWork,
            })?;
        let read = |e| Error::Store {
            source: error(e),
            when: When::AfterWork,
        };
        let changed: i64 = row.try_get("changed").map_err(read)?;
        if changed == 1 {
            return Ok(());
        }
        let database: String = row.try_get("database").map_err(read)?;
        match self.pool().connect_options().get_database() {
            Some(ours) if ours != database => Err(misuse(&format!(
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
    /// on a database that never saw the first attempt's writes.
    ///
    /// * `Ok(value)` is recorded and returned after the commit.
    /// * `Err(e)` rolls the business writes back, releases the key and
    ///   returns [`Error::Work`]; a retry runs the work again.
    /// * A caller whose lease was taken over while the work ran (a long
    ///   stall, a partition) gets [`Error::LeaseLost`], and its transaction
    ///   rolls back: a stale owner's business writes never land.
    /// * A failed commit is [`Error::Store`] with [`When::AfterWork`]; the
    ///   outcome and the writes landed together or not at all, and a retry
    ///   replays or runs accordingly. The key is released when nothing
    ///   landed.
    ///
    /// `idem` must claim keys in this store (its table, its database): the
    /// fenced update finds the claim only there. The closure receives the
    /// transaction's connection, not the transaction, so it cannot commit
    /// or roll back what it does not own; a savepoint
    /// (`sqlx::Connection::begin` on it) is fine. The heartbeat renews the
    /// lease through another pool connection while the work runs.
    ///
    /// ```no_run
    /// use idem_core::{Error, Idempotent};
    /// use idem_postgres::PostgresStore;
    ///
    /// # async fn run(store: PostgresStore) -> Result<(), Error<sqlx::Error>> {
    /// let idem = Idempotent::new(store.clone());
    /// let order = serde_json::json!({"amount": 1250, "currency": "EUR"});
    /// let charge: i64 = store
    ///     .execute_in_tx(&idem, "order-7f3a", &order, |tx| {
    ///         Box::pin(async move {
    ///             let row: (i64,) = sqlx::query_as(
    ///                 "INSERT INTO charges (amount) VALUES (1250) RETURNING id",
    ///             )
    ///             .fetch_one(&mut *tx)
    ///             .await?;
    ///             Ok(row.0)
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
        F: for<'c> FnOnce(&'c mut PgConnection) -> TxFuture<'c, Result<T, E>> + Send,
    {
        idem.execute_in_store_tx(key, body, || self.open_tx(), work)
            .await
    }

    /// Like [`execute_in_tx`](PostgresStore::execute_in_tx), but a work
    /// error for which `remember` returns `true` is recorded as a
    /// remembered failure **in the work's transaction** (with
    /// [`fail_in`](PostgresStore::fail_in)), and every retry gets it back
    /// as [`Error::Work`] without running — what
    /// [`Idempotent::execute_remembering`] does outside transactions. Use
    /// it for final answers such as "card declined".
    ///
    /// The work's writes made before it returned the remembered error
    /// commit with the failure (an audit row of the decline, say); undo
    /// them yourself, in a savepoint, if they must not stay. An error the
    /// work got from a failed statement has aborted the PostgreSQL
    /// transaction, so it cannot be recorded: then, as for any error
    /// `remember` refuses, the writes roll back, the key is released and
    /// the caller gets [`Error::Work`].
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
        F: for<'c> FnOnce(&'c mut PgConnection) -> TxFuture<'c, Result<T, E>> + Send,
    {
        idem.execute_in_store_tx_remembering(key, body, remember, || self.open_tx(), work)
            .await
    }

    async fn open_tx(&self) -> Result<PgTx<'_>, StoreError> {
        let tx = idem_sql::begin(self.pool()).await.map_err(error)?;
        Ok(PgTx { store: self, tx })
    }
}

/// A transaction on the store's pool, as the shared driver in idem-core
/// runs it.
struct PgTx<'s> {
    store: &'s PostgresStore,
    tx: Transaction<'static, Postgres>,
}

impl StoreTx for PgTx<'_> {
    type Conn = PgConnection;

    fn conn(&mut self) -> &mut PgConnection {
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
