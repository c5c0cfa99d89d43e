//! Durable steps whose effect is in this database: the step's writes and
//! its journal entry commit in one transaction, on the writer thread.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use idem_core::steps::StepStart;
use idem_core::Steps;
use idem_core::{Error, When};
use rusqlite::Connection;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::group::{Settle, TxWork};
use crate::ops::{Done, Op};
use crate::store::unexpected;
use crate::SqliteStore;

/// What the step's work produced, kept until the commit says whether it
/// stands.
enum Produced<S, E> {
    Value(S, Vec<u8>),
    Work(E),
    Encode(serde_json::Error),
    Panic(Box<dyn Any + Send>),
}

impl SqliteStore {
    /// Runs the durable step `name` as a synchronous closure on the store's
    /// writer connection, inside a savepoint of the writer's transaction,
    /// and records its outcome in the step journal in that same savepoint:
    /// the step's writes and its record commit together, so its effect
    /// happens **exactly once** across crashes, takeovers and retries. A
    /// recorded step returns its recorded outcome and `work` does not run.
    ///
    /// `steps` is the context [`Durable::execute`](idem_core::Durable::execute)
    /// gave the work, whose key this store holds. The journal write is a
    /// compare-and-set on the run's current token: a stale owner's writes
    /// are undone and it gets [`Error::LeaseLost`]. As with
    /// [`execute_in_batch`](SqliteStore::execute_in_batch), `work` blocks every
    /// other caller of the store while it runs and cannot commit or roll
    /// back; and no renewal of this run's lease runs meanwhile, so keep it
    /// to a few statements.
    ///
    /// * `Err(e)` undoes the work's writes and is [`Error::Work`]; nothing
    ///   is recorded.
    /// * A panic undoes the work's writes and resumes in the caller.
    ///
    /// ```
    /// use idem_core::{Error, Idempotent};
    /// use idem_sqlite::SqliteStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = SqliteStore::open_in_memory().await?;
    /// let idem = Idempotent::new(store.clone());
    /// let rows: i64 = idem
    ///     .execute_steps("order-7f3a", "body", |steps| async move {
    ///         store
    ///             .step_in_tx(&steps, "reserve", |conn| {
    ///                 conn.execute_batch("CREATE TABLE IF NOT EXISTS stock (sku TEXT)")?;
    ///                 conn.execute("INSERT INTO stock VALUES ('a')", [])?;
    ///                 conn.query_row("SELECT count(*) FROM stock", [], |r| r.get(0))
    ///             })
    ///             .await
    ///     })
    ///     .await
    ///     .map_err(|e: Error<rusqlite::Error>| e.to_string())?;
    /// assert_eq!(rows, 1);
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
        S: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Connection) -> Result<S, E> + Send + 'static,
    {
        let pending = match steps
            .begin_step(name)
            .await
            .map_err(Error::into_work_error)?
        {
            StepStart::Replayed(value) => return Ok(value),
            StepStart::Run(pending) => pending,
        };
        // The writer is taken before the work runs: the journal it extends
        // is encoded on the writer thread, and no renewal may write an
        // older journal meanwhile.
        let writer = pending.writer().await.map_err(Error::into_work_error)?;
        let encoder = writer.encoder();
        let produced = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&produced);
        let job = move |conn: &Connection| {
            let (settle, kept) = match panic::catch_unwind(AssertUnwindSafe(|| work(conn))) {
                Ok(Ok(value)) => match encoder.encode(&value) {
                    Ok(payload) => (
                        Settle::Complete(payload.clone()),
                        Produced::Value(value, payload),
                    ),
                    Err(encode) => (Settle::Release, Produced::Encode(encode)),
                },
                Ok(Err(error)) => (Settle::Release, Produced::Work(error)),
                Err(panic) => (Settle::Abandon, Produced::Panic(panic)),
            };
            if let Ok(mut slot) = slot.lock() {
                *slot = Some(kept);
            }
            settle
        };
        let template = writer.record(&[]);
        let op = Op::Work(TxWork::step(
            writer.key().to_owned(),
            writer.expected(),
            &template,
            Box::new(job),
        ));
        let done = self.call(op).await;
        let produced = produced.lock().ok().and_then(|mut slot| slot.take());
        match (done, produced) {
            (Ok(Done::Changed(true)), Some(Produced::Value(value, payload))) => {
                writer.committed_with(&payload);
                Ok(value)
            }
            (Ok(Done::Changed(true)), Some(Produced::Work(error))) => {
                writer.unchanged();
                Err(Error::Work(error))
            }
            (Ok(Done::Changed(true)), Some(Produced::Encode(error))) => {
                writer.unchanged();
                Err(Error::Encode(error))
            }
            (Ok(_), Some(Produced::Panic(panic))) => {
                writer.unchanged();
                panic::resume_unwind(panic)
            }
            (Ok(Done::Changed(false)), _) => {
                writer.lost();
                Err(Error::LeaseLost)
            }
            // Whether anything committed is unknown: dropping the writer
            // stops the run, and a retry resumes from the store.
            (Ok(other), _) => Err(Error::Store {
                source: unexpected(other),
                when: When::AfterWork,
            }),
            (Err(source), _) => Err(Error::Store {
                source,
                when: When::AfterWork,
            }),
        }
    }
}
