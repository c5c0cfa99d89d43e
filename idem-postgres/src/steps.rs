//! Durable steps whose effect is in this database: the step's business
//! writes and its journal entry commit in one transaction.

use idem_core::steps::StepStart;
use idem_core::Steps;
use idem_core::{Error, When};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::postgres::PgConnection;
use sqlx::Row;

use crate::error::error;
use crate::store::bind_record;
use crate::tx::TxFuture;
use crate::PostgresStore;

impl PostgresStore {
    /// Runs the durable step `name` **inside a transaction on this store's
    /// pool** and records its outcome in the step journal in that same
    /// transaction, so the step's business writes and its record commit
    /// together: its effect happens **exactly once** across crashes,
    /// takeovers and retries. A recorded step returns its recorded outcome
    /// and `work` does not run.
    ///
    /// `steps` is the context [`Durable::execute`](idem_core::Durable::execute)
    /// gave the work, whose key this store holds (the journal's fenced
    /// update must find the key in this table). The journal update is a
    /// compare-and-set on the run's current token: a stale owner (its key
    /// was taken over) finds no row, its transaction rolls back and it gets
    /// [`Error::LeaseLost`]. While the update waits for its commit no
    /// renewal runs, so none can write an older journal over it.
    ///
    /// * `Err(e)` from `work` rolls back and is [`Error::Work`]; nothing is
    ///   recorded.
    /// * A failed commit is [`Error::Store`] with [`When::AfterWork`]: the
    ///   step and its record landed together or not at all; the run stops
    ///   (later steps are [`StepsError::Interrupted`](idem_core::StepsError))
    ///   and a retry resumes from what committed.
    ///
    /// Two store round trips more than the work's own statements: the
    /// `BEGIN` and the journal update (the commit is the transaction's).
    ///
    /// ```no_run
    /// use idem_core::{Error, Idempotent};
    /// use idem_postgres::PostgresStore;
    ///
    /// # async fn run(store: PostgresStore) -> Result<(), Error<sqlx::Error>> {
    /// let idem = Idempotent::new(store.clone());
    /// let id: i64 = idem
    ///     .execute_steps("order-7f3a", "body", |steps| async move {
    ///         store
    ///             .step_in_tx(&steps, "reserve", |tx| {
    ///                 Box::pin(async move {
    ///                     let row: (i64,) =
    ///                         sqlx::query_as("INSERT INTO reservations (sku) VALUES ('a') RETURNING id")
    ///                             .fetch_one(&mut *tx)
    ///                             .await?;
    ///                     Ok(row.0)
    ///                 })
    ///             })
    ///             .await
    ///     })
    ///     .await?;
    /// # let _ = id;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn step_in_tx<S, E, F>(
        &self,
        steps: &Steps,
        name: &str,
        work: F,
    ) -> Result<S, Error<E>>
    where
        S: Serialize + DeserializeOwned + Send,
        E: Send,
        F: for<'c> FnOnce(&'c mut PgConnection) -> TxFuture<'c, Result<S, E>> + Send,
    {
        let pending = match steps
            .begin_step(name)
            .await
            .map_err(Error::into_work_error)?
        {
            StepStart::Replayed(value) => return Ok(value),
            StepStart::Run(pending) => pending,
        };
        let store_error = |e, when| Error::Store {
            source: error(e),
            when,
        };
        let mut tx = idem_sql::begin(self.pool())
            .await
            .map_err(|e| store_error(e, When::BeforeWork))?;
        let value = match work(&mut tx).await {
            Ok(value) => value,
            Err(work_error) => {
                let _ = tx.rollback().await;
                return Err(Error::Work(work_error));
            }
        };
        // Dropping `tx` on an early return rolls it back.
        let mut writer = pending.writer().await.map_err(Error::into_work_error)?;
        let payload = match writer.encode(&value) {
            Ok(payload) => payload,
            Err(encode) => {
                writer.unchanged();
                return Err(Error::Encode(encode));
            }
        };
        let record = writer.record(&payload);
        let expected = writer.expected();
        let query = sqlx::query(&self.statements().complete_in)
            .bind(writer.key())
            .bind(&expected.as_bytes()[..]);
        let changed = match bind_record(query, &record).fetch_one(&mut *tx).await {
            Ok(row) => row.try_get::<i64, _>("changed"),
            Err(e) => Err(e),
        };
        match changed {
            Ok(1) => {}
            Ok(_) => {
                let _ = tx.rollback().await;
                writer.lost();
                return Err(Error::LeaseLost);
            }
            Err(e) => {
                // The update failed: PostgreSQL aborted the transaction and
                // nothing of the step lands.
                let _ = tx.rollback().await;
                writer.unchanged();
                return Err(store_error(e, When::AfterWork));
            }
        }
        match tx.commit().await {
            Ok(()) => {
                writer.committed();
                Ok(value)
            }
            // A cut-off commit may have landed: dropping the writer stops
            // the run, and a retry resumes from what the database holds.
            Err(e) => Err(store_error(e, When::AfterWork)),
        }
    }
}
