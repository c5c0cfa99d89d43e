//! Work inside the writer's group commit: a synchronous closure run on the
//! writer thread, inside a savepoint of the writer's current transaction,
//! and its outcome recorded by the fenced swap in that same savepoint.
//!
//! Why this form exists beside [`SqliteTx`](crate::SqliteTx): every write
//! goes through the one writer connection, so a transaction held across
//! awaits keeps every other caller waiting for as long as it is open. A
//! synchronous closure costs the others only the closure's own run time,
//! and its writes join the batch of operations that queued meanwhile, so
//! they share one commit (one fsync) with them. The transaction form is
//! built on it (its session is one such work).

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use idem_core::store::{NewRecord, State, Token};
use idem_core::{BeginJson, Error, Fingerprint, Idempotent, Lease, When};
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::Connection;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ops::{Done, Op, OpError, Owned};
use crate::store::unexpected;
use crate::SqliteStore;

pub(crate) const SAVEPOINT: &str = "idem_work";

/// What to do with the key once the work ran, inside its savepoint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settle {
    /// Keep the work's writes and record this payload as the `Completed`
    /// outcome.
    Complete(Vec<u8>),
    /// Keep the work's writes and record this payload as a remembered
    /// failure (`Failed`).
    Fail(Vec<u8>),
    /// Undo the work's writes and give the key back: a retry runs again.
    Release,
    /// Undo the work's writes and leave the key claimed until its lease
    /// lapses (what a panic in the work does).
    Abandon,
}

pub(crate) type WorkFn = Box<dyn FnOnce(&Connection) -> Settle + Send>;

/// The work of one lease, on its way to the writer thread.
pub(crate) struct TxWork {
    key: String,
    token: Token,
    fingerprint: Fingerprint,
    retention: std::time::Duration,
    /// A durable step's journal write instead of a settle: `Complete`
    /// keeps the record `InFlight` under this new token and lease.
    pub(crate) step: Option<(Token, std::time::Duration)>,
    // Taken once by the writer; a job is never run twice, because it is
    // always the last of its batch (see `Writer::run`).
    work: Cell<Option<WorkFn>>,
}

impl TxWork {
    /// The key this work settles when it commits, `None` for a durable
    /// step (its record stays in flight).
    pub(crate) fn settles(&self) -> Option<&str> {
        self.step.is_none().then_some(self.key.as_str())
    }
}

impl fmt::Debug for TxWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TxWork")
            .field("key", &self.key)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// Runs the work in a savepoint of the writer's open transaction and
/// settles the key there. Answers `Changed(true)` when the settle asked for
/// took effect, `Changed(false)` when the lease was lost (the work's writes
/// are undone).
pub(crate) fn run(conn: &Connection, job: &TxWork) -> Result<Done, OpError> {
    let Some(work) = job.work.take() else {
        return Err(OpError::Bad(crate::error::Failure::BadRow(
            "a transactional work ran twice".to_owned(),
        )));
    };
    let settle = in_savepoint(conn, work)?;
    let (state, payload) = match settle {
        Ok(Settle::Complete(payload)) => (State::Completed, payload),
        Ok(Settle::Fail(payload)) => (State::Failed, payload),
        Ok(Settle::Release) if job.step.is_some() => {
            // A step is never released: the journal must stay.
            undo(conn)?;
            return Ok(Done::Changed(true));
        }
        Ok(Settle::Release) => {
            undo(conn)?;
            return Op::Remove {
                key: job.key.clone(),
                expected: job.token,
            }
            .run(conn);
        }
        Ok(Settle::Abandon) | Err(_) => {
            undo(conn)?;
            return Ok(Done::Changed(true));
        }
    };
    let record = match job.step {
        Some((token, lease)) => NewRecord {
            token,
            fingerprint: job.fingerprint,
            state: State::InFlight,
            payload: &payload,
            lease: Some(lease),
            retention: job.retention,
        },
        None => NewRecord {
            token: job.token,
            fingerprint: job.fingerprint,
            state,
            payload: &payload,
            lease: None,
            retention: job.retention,
        },
    };
    let swap = Op::Swap {
        key: job.key.clone(),
        expected: job.token,
        record: Owned::from(&record),
        take_over: false,
    };
    match swap.run(conn)? {
        Done::Changed(true) => {
            statement(conn, &format!("RELEASE {SAVEPOINT}"))?;
            Ok(Done::Changed(true))
        }
        // A stale owner: its writes go with the savepoint.
        _ => {
            undo(conn)?;
            Ok(Done::Changed(false))
        }
    }
}

/// Opens the work's savepoint and runs `work` in it, with SQLite refusing
/// any statement that would end the savepoint or the transaction; the
/// caller then releases or undoes the savepoint. A panic in `work` is
/// caught and handed back, so that it never takes the writer thread (and
/// every caller) down.
pub(crate) fn in_savepoint<R>(
    conn: &Connection,
    work: impl FnOnce(&Connection) -> R,
) -> Result<std::thread::Result<R>, OpError> {
    statement(conn, &format!("SAVEPOINT {SAVEPOINT}"))?;
    // The work may not end the transaction it runs in, nor the savepoint:
    // its writes must commit with the outcome or not at all. SQLite asks
    // the authorizer when a statement is prepared, so a `COMMIT` inside the
    // work fails with an authorization error instead of running.
    conn.authorizer(Some(|context: AuthContext<'_>| match context.action {
        AuthAction::Transaction { .. } => Authorization::Deny,
        AuthAction::Savepoint { savepoint_name, .. } if savepoint_name == SAVEPOINT => {
            Authorization::Deny
        }
        _ => Authorization::Allow,
    }));
    let ran = panic::catch_unwind(AssertUnwindSafe(|| work(conn)));
    conn.authorizer(None::<fn(AuthContext<'_>) -> Authorization>);
    if conn.is_autocommit() {
        // SQLite itself rolled the whole transaction back (a full disk, an
        // I/O error): the batch must run again without this job.
        return Err(OpError::Statement(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
            Some("the transaction was rolled back while the work ran".to_owned()),
        )));
    }
    Ok(ran)
}

pub(crate) fn undo(conn: &Connection) -> rusqlite::Result<()> {
    statement(conn, &format!("ROLLBACK TO {SAVEPOINT}"))?;
    statement(conn, &format!("RELEASE {SAVEPOINT}"))
}

pub(crate) fn statement(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// What the work of [`SqliteStore::execute_in_batch`] produced, kept until
/// the commit says whether it stands.
enum Produced<T, E> {
    Value(T),
    Work(E),
    Encode(serde_json::Error),
    Panic(Box<dyn Any + Send>),
}

impl TxWork {
    /// A durable step's work: `Complete(journal)` writes the journal as
    /// the `InFlight` record's payload, fenced by `expected`, under
    /// `token`.
    pub(crate) fn step(
        key: String,
        expected: Token,
        record: &NewRecord<'_>,
        work: WorkFn,
    ) -> TxWork {
        TxWork {
            key,
            token: expected,
            fingerprint: record.fingerprint,
            retention: record.retention,
            step: Some((record.token, record.lease.unwrap_or_default())),
            work: Cell::new(Some(work)),
        }
    }
}

impl SqliteStore {
    /// Runs `work` on the store's writer connection, inside a savepoint of
    /// the writer's current transaction, then settles the lease there as
    /// `work` says: a fenced swap for [`Settle::Complete`] and
    /// [`Settle::Fail`] (the work's writes and the outcome commit together),
    /// or an undo of the work's writes for [`Settle::Release`] (then the key
    /// is released) and [`Settle::Abandon`].
    ///
    /// The low-level step under [`execute_in_batch`](SqliteStore::execute_in_batch).
    /// Returns once the transaction committed. [`Error::LeaseLost`] means
    /// the lease was taken over or already settled: the work's writes were
    /// undone. `work` cannot end the transaction or the savepoint (SQLite
    /// refuses `COMMIT`, `ROLLBACK` and `RELEASE` inside it with an
    /// authorization error); savepoints of its own are fine.
    ///
    /// A transaction that does not commit gives the key back before the
    /// error returns, whatever ended it: SQLite undoing it (a trigger's
    /// `RAISE(ROLLBACK)`, an `OR ROLLBACK` conflict, a full disk), a failed
    /// statement of the settle, or a failed commit. Nothing of the work
    /// landed then, so a retry runs at once instead of waiting for the
    /// lease to lapse. The release is fenced on the token and the in-flight
    /// state, so it never undoes an outcome that did commit. Only a work
    /// that chose [`Settle::Abandon`] or panicked keeps the key claimed.
    ///
    /// `work` runs on the writer thread and every other caller of the store
    /// waits while it runs: keep it to a few statements, with no network
    /// calls and no sleeping.
    pub async fn settle_in_tx(
        &self,
        lease: &Lease,
        work: impl FnOnce(&Connection) -> Settle + Send + 'static,
    ) -> Result<(), Error> {
        // Set while the work runs and kept when it abandons: a panic leaves
        // it set, so a key whose work may have half happened stays claimed.
        let held = Arc::new(AtomicBool::new(false));
        let holds = Arc::clone(&held);
        let work = move |conn: &Connection| {
            holds.store(true, Ordering::Relaxed);
            let settle = work(conn);
            holds.store(settle == Settle::Abandon, Ordering::Relaxed);
            settle
        };
        let op = Op::Work(TxWork {
            key: lease.key().as_str().to_owned(),
            token: lease.token(),
            fingerprint: lease.fingerprint(),
            retention: lease.retention(),
            step: None,
            work: Cell::new(Some(Box::new(work))),
        });
        let ran = lease.run(self.call(op)).await;
        match ran.output {
            // The writer thread has woken the key's waiters at commit.
            Ok(Done::Changed(true)) => Ok(()),
            Ok(Done::Changed(false)) => Err(Error::LeaseLost),
            Ok(other) => Err(Error::Store {
                source: unexpected(other),
                when: When::AfterWork,
            }),
            Err(source) => {
                // The writer answers an error only for a job whose
                // transaction it rolled back or failed to commit.
                if !held.load(Ordering::Relaxed) {
                    let _ = lease.release().await;
                }
                Err(Error::Store {
                    source,
                    when: When::AfterWork,
                })
            }
        }
    }

    /// Runs `work` exactly once for `key` and `body` in the same SQLite
    /// transaction as its recorded outcome, and replays that outcome to
    /// every retry.
    ///
    /// The claim commits first, on its own. Then `work` runs as a
    /// synchronous closure on the store's writer thread, inside a savepoint
    /// of the transaction that batches the operations waiting at that
    /// moment; the fenced completion runs in the same savepoint, and the
    /// batch's one commit makes the work's writes and the outcome durable
    /// together (group commit is kept: other callers share that commit).
    /// A crash leaves both or neither.
    ///
    /// * `Ok(value)` is recorded and returned after the commit.
    /// * `Err(e)` undoes the work's writes, releases the key and returns
    ///   [`Error::Work`]; a retry runs the work again.
    /// * A lease taken over before the completion: the work's writes are
    ///   undone and the caller gets [`Error::LeaseLost`].
    /// * A panic in `work` undoes its writes, leaves the key claimed until
    ///   the lease lapses, and resumes in the caller.
    ///
    /// `work` gets the writer's connection: it may read and write any table
    /// in the database file (and open savepoints of its own) but cannot
    /// commit or roll back (SQLite refuses with an authorization error). It
    /// blocks every other caller of the store while it runs: keep it to a
    /// few statements. `idem` must claim keys in this store.
    ///
    /// ```
    /// use idem_core::{Error, Idempotent};
    /// use idem_sqlite::SqliteStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = SqliteStore::open_in_memory().await?;
    /// let idem = Idempotent::new(store.clone());
    /// store
    ///     .execute_in_batch(&idem, "setup", &(), |conn| {
    ///         conn.execute_batch("CREATE TABLE charges (key TEXT PRIMARY KEY, amount INTEGER)")
    ///     })
    ///     .await?;
    /// let charge = |conn: &rusqlite::Connection| {
    ///     conn.execute("INSERT INTO charges VALUES ('order-7f3a', 1250)", [])?;
    ///     Ok::<_, rusqlite::Error>(conn.last_insert_rowid())
    /// };
    /// let first: i64 = store.execute_in_batch(&idem, "order-7f3a", &1250, charge).await?;
    /// let retry: i64 = store.execute_in_batch(&idem, "order-7f3a", &1250, charge).await?;
    /// assert_eq!(first, retry); // replayed: one row, one outcome
    /// # Ok(())
    /// # }
    /// ```
    pub async fn execute_in_batch<B, T, E, F>(
        &self,
        idem: &Idempotent,
        key: &str,
        body: &B,
        work: F,
    ) -> Result<T, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let lease = match idem.begin_json(key, body).await? {
            BeginJson::Run(lease) => lease,
            BeginJson::Replayed(value) => return Ok(value),
        };
        self.run_in_tx(lease, work, |_| None).await
    }

    /// Like [`execute_in_batch`](SqliteStore::execute_in_batch), but a work error
    /// for which `remember` returns `true` is recorded as a remembered
    /// failure in the work's savepoint ([`Settle::Fail`]): the work's
    /// writes made before it returned the error commit with the failure,
    /// and every retry gets the error back as [`Error::Work`] without
    /// running — what [`Idempotent::execute_remembering`] does outside
    /// transactions. Any other error undoes the writes and releases the
    /// key. `remember` runs on the writer thread with the work.
    ///
    /// ```
    /// use idem_core::{Error, Idempotent};
    /// use idem_sqlite::SqliteStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = SqliteStore::open_in_memory().await?;
    /// let idem = Idempotent::new(store.clone());
    /// let decline = |_: &rusqlite::Connection| Err::<u32, _>("card declined".to_owned());
    /// for _ in 0..2 {
    ///     let answer = store
    ///         .execute_in_batch_remembering(&idem, "order-7f3a", &1250, |_: &String| true, decline)
    ///         .await;
    ///     assert!(matches!(answer, Err(Error::Work(e)) if e == "card declined"));
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn execute_in_batch_remembering<B, T, E, R, F>(
        &self,
        idem: &Idempotent,
        key: &str,
        body: &B,
        remember: R,
        work: F,
    ) -> Result<T, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Serialize + DeserializeOwned + Send + 'static,
        R: FnOnce(&E) -> bool + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let lease = match idem.begin_json_remembering(key, body).await? {
            BeginJson::Run(lease) => lease,
            BeginJson::Replayed(value) => return Ok(value),
        };
        self.run_in_tx(lease, work, move |error| {
            remember(error).then(|| serde_json::to_vec(error))
        })
        .await
    }

    async fn run_in_tx<T, E, F, R>(&self, lease: Lease, work: F, remember: R) -> Result<T, Error<E>>
    where
        T: Serialize + Send + 'static,
        E: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        R: FnOnce(&E) -> Option<serde_json::Result<Vec<u8>>> + Send + 'static,
    {
        let produced = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&produced);
        let settled = self
            .settle_in_tx(&lease, move |conn| {
                let (settle, kept) = match panic::catch_unwind(AssertUnwindSafe(|| work(conn))) {
                    Ok(Ok(value)) => match serde_json::to_vec(&value) {
                        Ok(payload) => (Settle::Complete(payload), Produced::Value(value)),
                        Err(encode) => (Settle::Release, Produced::Encode(encode)),
                    },
                    Ok(Err(error)) => match remember(&error) {
                        Some(Ok(payload)) => (Settle::Fail(payload), Produced::Work(error)),
                        // A failure that cannot be encoded cannot be
                        // remembered: the key goes back, as for any other.
                        Some(Err(_)) | None => (Settle::Release, Produced::Work(error)),
                    },
                    Err(panic) => (Settle::Abandon, Produced::Panic(panic)),
                };
                if let Ok(mut slot) = slot.lock() {
                    *slot = Some(kept);
                }
                settle
            })
            .await;
        let produced = produced.lock().ok().and_then(|mut slot| slot.take());
        match (settled, produced) {
            (Ok(()), Some(Produced::Value(value))) => Ok(value),
            (Ok(()), Some(Produced::Work(error))) => Err(Error::Work(error)),
            (Ok(()), Some(Produced::Encode(error))) => Err(Error::Encode(error)),
            (_, Some(Produced::Panic(panic))) => panic::resume_unwind(panic),
            // The transaction did not commit (settle_in_tx gave the key
            // back) or the lease was lost: nothing of the attempt landed,
            // and the work's own error is what the caller must see.
            (Err(_), Some(Produced::Work(error))) => Err(Error::Work(error)),
            (Err(error), _) => Err(error.into_work_error()),
            (Ok(()), None) => Err(Error::Store {
                source: unexpected(Done::Changed(true)),
                when: When::AfterWork,
            }),
        }
    }
}
