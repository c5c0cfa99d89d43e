//! Transactional completion in the shape every SQL store shares: a
//! transaction the caller holds across awaits ([`SqliteTx`], from
//! [`SqliteStore::begin`]), `complete_in` / `fail_in` inside it, handing
//! back the [`Uncommitted`] guard, and `execute_in_tx` over idem-core's
//! driver.
//!
//! The transaction is a session on the writer thread: one job of the
//! writer's group commit (the last of its batch) that runs the caller's
//! closures inside the work's savepoint until the caller commits or rolls
//! back. The store has one writer connection, so while a `SqliteTx` is open
//! every other write of the store waits for it, as every write to a SQLite
//! file waits for the one writer holding its lock.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;

use idem_core::store::{State, StoreError, StoreTx, Uncommitted};
use idem_core::{Error, Idempotent, Lease, When};
use rusqlite::Connection;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot;

use crate::error::{Failure, BACKEND};
use crate::group::{in_savepoint, statement, undo, SAVEPOINT};
use crate::ops::{Done, Op, OpError, Owned};
use crate::store::unexpected;
use crate::writer::{Command, Job};
use crate::SqliteStore;

/// The future a transactional work closure returns (defined in idem-core,
/// shared by every SQL store): write `|tx| Box::pin(async move { … })`.
pub use idem_core::store::TxFuture;

/// A closure sent to an open session; `false` ends the session (it
/// panicked, and the writes it left half done must go).
type Call = Box<dyn FnOnce(&Connection) -> bool + Send>;

enum Step {
    Call(Call),
    End { keep: bool },
}

/// A caller's transaction as the writer thread serves it.
pub(crate) struct Session {
    // Taken once: a session, like a transactional work, is the last job of
    // its batch and never runs twice.
    steps: std::cell::Cell<Option<mpsc::Receiver<Step>>>,
    started: std::cell::Cell<Option<oneshot::Sender<()>>>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

/// Serves a session on the writer's open transaction, inside the work's
/// savepoint: its closures run in the order sent, until the caller ends
/// it. Answers `Changed(true)` when its writes are kept (they commit with
/// the batch), `Changed(false)` when they were undone.
pub(crate) fn serve(conn: &Connection, session: &Session) -> Result<Done, OpError> {
    let Some(steps) = session.steps.take() else {
        return Err(OpError::Bad(Failure::BadRow(
            "a transaction's session ran twice".to_owned(),
        )));
    };
    let started = session.started.take();
    let keep = in_savepoint(conn, move |conn| {
        if let Some(started) = started {
            let _ = started.send(());
        }
        loop {
            match steps.recv() {
                Ok(Step::Call(call)) => {
                    if !call(conn) || conn.is_autocommit() {
                        return false;
                    }
                }
                Ok(Step::End { keep }) => return keep,
                // The `SqliteTx` was dropped: a rollback.
                Err(mpsc::RecvError) => return false,
            }
        }
    })?;
    if keep.unwrap_or(false) {
        statement(conn, &format!("RELEASE {SAVEPOINT}"))?;
        Ok(Done::Changed(true))
    } else {
        undo(conn)?;
        Ok(Done::Changed(false))
    }
}

/// A transaction on the store's database file, held by the caller across
/// awaits: what [`SqliteStore::begin`] opens, and what the work of
/// [`SqliteStore::execute_in_tx`] writes through. End it with
/// [`commit`](SqliteTx::commit) or [`rollback`](SqliteTx::rollback);
/// dropping it rolls back.
///
/// Its statements run on the store's writer connection, inside a savepoint
/// of the writer's transaction, in the closures given to
/// [`call`](SqliteTx::call): rusqlite is synchronous, so a statement is a
/// closure over a [`Connection`] sent to the writer thread. While it is
/// open, the writer serves only it: every other write of the store (claims,
/// completions, renewals, other transactions) waits for its end. Keep it
/// short, and never await another operation of the same store while it is
/// open (that operation waits for this transaction, which waits for you).
/// The closures cannot end the transaction or its savepoint (SQLite refuses
/// `COMMIT`, `ROLLBACK` and `RELEASE idem_work` with an authorization
/// error); savepoints of their own are fine.
pub struct SqliteTx {
    store: SqliteStore,
    // `None` once the transaction ended.
    steps: Option<mpsc::Sender<Step>>,
    ended: Option<oneshot::Receiver<Result<Done, Failure>>>,
    /// The keys settled in it, whose waiters the commit wakes.
    settled: Vec<String>,
}

impl fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteTx")
            .field("open", &self.steps.is_some())
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

impl SqliteTx {
    /// Runs `statements` on the transaction's connection and returns what
    /// they returned. A panic in them rolls the transaction back and
    /// resumes in the caller. Once the transaction has ended (committed,
    /// rolled back, or undone by SQLite after an I/O error) this is an
    /// `SQLITE_ABORT` error saying so.
    pub async fn call<T, F>(&mut self, statements: F) -> rusqlite::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let call: Call = Box::new(move |conn| {
            let ran = panic::catch_unwind(AssertUnwindSafe(|| statements(conn)));
            let go_on = ran.is_ok();
            let _ = reply.send(ran);
            go_on
        });
        self.send(Step::Call(call))
            .map_err(|()| ended("the transaction has ended"))?;
        match answer.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(panicked)) => {
                self.steps = None;
                panic::resume_unwind(panicked)
            }
            Err(_) => Err(ended("the transaction has ended")),
        }
    }

    /// Commits: the writes made in it, and the outcomes recorded by
    /// `complete_in` / `fail_in`, become durable together with the
    /// writer's batch. A transaction that had already been undone (a
    /// panic in one of its closures, an I/O error) is an error, and nothing
    /// of it landed.
    pub async fn commit(mut self) -> Result<(), StoreError> {
        match self.end(true).await? {
            true => {
                for key in &self.settled {
                    self.store.wakeups.wake(key);
                }
                Ok(())
            }
            false => Err(StoreError::backend(
                BACKEND,
                "the transaction was rolled back before its commit (a panic in its \
                 statements, or SQLite undid it after an I/O error); nothing of it landed",
            )),
        }
    }

    /// Rolls back: nothing written in it lands. An error means the writer
    /// could not answer; the transaction's writes are undone all the same
    /// (the writer's batch fails without them).
    pub async fn rollback(mut self) -> Result<(), StoreError> {
        self.end(false).await.map(drop)
    }

    fn send(&self, step: Step) -> Result<(), ()> {
        match &self.steps {
            Some(steps) => steps.send(step).map_err(drop),
            None => Err(()),
        }
    }

    /// Ends the session; whether its writes were kept.
    async fn end(&mut self, keep: bool) -> Result<bool, StoreError> {
        let _ = self.send(Step::End { keep });
        self.steps = None;
        let Some(ended) = self.ended.take() else {
            return Ok(false);
        };
        match ended.await {
            Ok(Ok(Done::Changed(kept))) => Ok(kept),
            Ok(Ok(other)) => Err(unexpected(other)),
            Ok(Err(failure)) => Err(failure.into_store_error()),
            Err(_) => Err(Failure::WriterGone.into_store_error()),
        }
    }

    /// Runs one of the store's operations inside the transaction. `Err`
    /// means the transaction had ended; so does an answer after which
    /// SQLite left no transaction open (it undid it): either way
    /// [`has_ended`](SqliteTx::has_ended) says so afterwards.
    async fn op(&mut self, op: Op) -> Result<Result<Done, OpError>, ()> {
        let (reply, answer) = oneshot::channel();
        let call: Call = Box::new(move |conn| {
            let _ = reply.send((op.run(conn), conn.is_autocommit()));
            true
        });
        if self.send(Step::Call(call)).is_err() {
            self.steps = None;
            return Err(());
        }
        match answer.await {
            Ok((done, undone)) => {
                if undone {
                    self.steps = None;
                }
                Ok(done)
            }
            Err(_) => {
                self.steps = None;
                Err(())
            }
        }
    }

    /// Whether the transaction is known to have ended without a commit: a
    /// `SqliteTx` that commits is consumed, so one that ended while still
    /// held was rolled back (a panic) or undone by SQLite.
    fn has_ended(&self) -> bool {
        self.steps.is_none()
    }
}

fn ended(why: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
        Some(why.to_owned()),
    )
}

impl SqliteStore {
    /// Opens a transaction on the store's database file, for business
    /// writes whose outcome [`complete_in`](SqliteStore::complete_in)
    /// records inside it: the shape of `pool.begin()` on the server stores.
    ///
    /// Returns once the writer thread serves it, and from then on the
    /// writer serves only it (see [`SqliteTx`]). An error is the writer's
    /// (its `BEGIN` failed, or it is gone); nothing was opened.
    pub async fn begin(&self) -> Result<SqliteTx, StoreError> {
        let (steps, inbox) = mpsc::channel();
        let (started, serving) = oneshot::channel();
        let (reply, mut ended) = oneshot::channel();
        let session = Session {
            steps: std::cell::Cell::new(Some(inbox)),
            started: std::cell::Cell::new(Some(started)),
        };
        self.commands
            .send(Command::Job(Job {
                op: Op::Session(session),
                reply,
            }))
            .map_err(|_| Failure::WriterGone.into_store_error())?;
        if serving.await.is_err() {
            // The session never started: its job's answer says why.
            return Err(match (&mut ended).await {
                Ok(Err(failure)) => failure.into_store_error(),
                Ok(Ok(other)) => unexpected(other),
                Err(_) => Failure::WriterGone.into_store_error(),
            });
        }
        Ok(SqliteTx {
            store: self.clone(),
            steps: Some(steps),
            ended: Some(ended),
            settled: Vec::new(),
        })
    }

    /// Records `payload` as the lease's `Completed` outcome **inside** the
    /// open transaction `tx`, fenced by the lease's token; the same method,
    /// with the same guard, as on the PostgreSQL and MariaDB stores. Commit
    /// the transaction afterwards: the outcome becomes durable together
    /// with every write made in it, or, on rollback, neither does.
    ///
    /// End the transaction through the [`Uncommitted`] this returns,
    /// `done.commit(tx.commit())` or `done.rollback(tx.rollback())`; a
    /// rollback, a failed commit, or dropping both gives the key back (the
    /// release waits for the transaction to end).
    ///
    /// On an error while the transaction is still open, the lease is
    /// dropped and the key stays claimed until it lapses: writes the caller
    /// commits regardless would run twice if a retry could run at once. A
    /// transaction that has already ended cannot commit (SQLite undid it,
    /// say after a trigger's `RAISE(ROLLBACK)`), so the key is then given
    /// back before the error returns, and a retry runs at once.
    ///
    /// ```
    /// use std::convert::Infallible;
    ///
    /// use idem_core::{BeginJson, Idempotent};
    /// use idem_sqlite::SqliteStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = SqliteStore::open_in_memory().await?;
    /// let idem = Idempotent::new(store.clone());
    /// let BeginJson::Run(lease) = idem.begin_json::<_, i64, Infallible>("order-7f3a", &1250).await? else {
    ///     return Ok(()); // replayed
    /// };
    /// let mut tx = store.begin().await?;
    /// tx.call(|conn| conn.execute_batch("CREATE TABLE charges (amount INTEGER)")).await?;
    /// tx.call(|conn| conn.execute("INSERT INTO charges VALUES (1250)", [])).await?;
    /// let done = store.complete_in(&mut tx, lease, b"1250").await?;
    /// done.commit(tx.commit()).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// * [`Error::LeaseLost`]: the lease was taken over, or was already
    ///   settled: nothing was written; roll the transaction back, so that a
    ///   stale owner's writes never land.
    /// * A [config](idem_core::store::StoreErrorKind::Config) store error,
    ///   nothing written: `tx` is a transaction of another store (another
    ///   database file), or it has ended.
    /// * A backend store error: the statement failed; roll back.
    ///
    /// Run no heartbeat around the transaction: while it is open nothing
    /// can take the key over (every write of the store waits for it), and a
    /// renewal would wait for its end too.
    pub async fn complete_in(
        &self,
        tx: &mut SqliteTx,
        lease: Lease,
        payload: &[u8],
    ) -> Result<Uncommitted, Error> {
        self.settle_uncommitted(tx, lease, State::Completed, payload)
            .await
    }

    /// Like [`complete_in`](SqliteStore::complete_in), but records the
    /// payload as a remembered failure (`Failed`), replayed to every retry.
    pub async fn fail_in(
        &self,
        tx: &mut SqliteTx,
        lease: Lease,
        payload: &[u8],
    ) -> Result<Uncommitted, Error> {
        self.settle_uncommitted(tx, lease, State::Failed, payload)
            .await
    }

    /// `complete_in` and `fail_in`: the settle, and on an error in a
    /// transaction that has ended, the key given back.
    async fn settle_uncommitted(
        &self,
        tx: &mut SqliteTx,
        lease: Lease,
        state: State,
        payload: &[u8],
    ) -> Result<Uncommitted, Error> {
        match self.settle_in(tx, &lease, state, payload).await {
            Ok(()) => Ok(Uncommitted::new(lease)),
            Err(error) => {
                // Nothing of an ended transaction can land, the outcome
                // included; a lost lease is the taker-over's. The release
                // is fenced on the token and the in-flight state.
                if tx.has_ended() && !matches!(error, Error::LeaseLost) {
                    let _ = lease.release().await;
                }
                Err(error)
            }
        }
    }

    async fn settle_in(
        &self,
        tx: &mut SqliteTx,
        lease: &Lease,
        state: State,
        payload: &[u8],
    ) -> Result<(), Error> {
        // Clones share the writer, and with it the wake-ups: a store opened
        // on its own (even on the same file) has others.
        if !std::sync::Arc::ptr_eq(&tx.store.wakeups, &self.wakeups) {
            return Err(misuse(
                "the transaction is on another store's database than this store's; \
                 nothing was recorded",
            ));
        }
        let op = Op::Swap {
            key: lease.key().as_str().to_owned(),
            expected: lease.token(),
            record: Owned::from(&lease.record(state, payload)),
            take_over: false,
        };
        let after_work = |source| Error::Store {
            source,
            when: When::AfterWork,
        };
        match tx.op(op).await {
            Ok(Ok(Done::Changed(true))) => {
                tx.settled.push(lease.key().as_str().to_owned());
                Ok(())
            }
            Ok(Ok(Done::Changed(false))) => Err(Error::LeaseLost),
            Ok(Ok(other)) => Err(after_work(unexpected(other))),
            Ok(Err(OpError::Statement(error))) => Err(after_work(
                Failure::from_sqlite(error, std::time::Duration::ZERO).into_store_error(),
            )),
            Ok(Err(OpError::Bad(failure))) => Err(after_work(failure.into_store_error())),
            Err(()) => Err(misuse("the transaction has ended; nothing was recorded")),
        }
    }

    /// Runs `work` exactly once for `key` and `body` **inside a
    /// transaction on this store's file** ([`SqliteTx`]), records its
    /// outcome in that same transaction, and replays the outcome to every
    /// retry: the same method, closure and answers as on the PostgreSQL
    /// and MariaDB stores, with idem-core's
    /// [`execute_in_store_tx`](Idempotent::execute_in_store_tx) as the one
    /// policy.
    ///
    /// The claim commits on its own first. Then a transaction opens, `work`
    /// gets it (`&mut SqliteTx`, whose statements are closures run by
    /// [`SqliteTx::call`]), the fenced completion runs in it, and one
    /// commit makes the writes and the outcome durable together. A crash
    /// leaves both or neither.
    ///
    /// * `Ok(value)` is recorded and returned after the commit.
    /// * `Err(e)` rolls the writes back, releases the key and returns
    ///   [`Error::Work`].
    /// * A lease taken over before the transaction opened: the writes roll
    ///   back and the caller gets [`Error::LeaseLost`].
    ///
    /// The difference the single writer makes: while the work runs, every
    /// other write of the store waits (a concurrent caller of the same key
    /// is told the outcome once it committed, rather than
    /// [`Error::InProgress`] meanwhile), and no heartbeat runs, since
    /// nothing can take the key over then. Keep the work short and never
    /// await another operation of this store inside it. Where throughput
    /// matters more than the shared shape,
    /// [`execute_in_batch`](SqliteStore::execute_in_batch) runs a
    /// synchronous closure inside the writer's group commit instead.
    ///
    /// ```
    /// use idem_core::{Error, Idempotent};
    /// use idem_sqlite::SqliteStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = SqliteStore::open_in_memory().await?;
    /// let idem = Idempotent::new(store.clone());
    /// let mut charges = Vec::new();
    /// for _ in 0..2 {
    ///     let charge: i64 = store
    ///         .execute_in_tx(&idem, "order-7f3a", &1250, |tx| {
    ///             Box::pin(async move {
    ///                 tx.call(|conn| {
    ///                     conn.execute_batch("CREATE TABLE IF NOT EXISTS charges (amount INTEGER)")?;
    ///                     conn.execute("INSERT INTO charges VALUES (1250)", [])?;
    ///                     Ok(conn.last_insert_rowid())
    ///                 })
    ///                 .await
    ///             })
    ///         })
    ///         .await?;
    ///     charges.push(charge);
    /// }
    /// let [first, retry] = charges[..] else { unreachable!() };
    /// assert_eq!(first, retry); // replayed: one row, one outcome
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
        F: for<'c> FnOnce(&'c mut SqliteTx) -> TxFuture<'c, Result<T, E>> + Send,
    {
        idem.execute_in_store_tx(key, body, || self.open_tx(), work)
            .await
    }

    /// Like [`execute_in_tx`](SqliteStore::execute_in_tx), but a work
    /// error for which `remember` returns `true` is recorded as a
    /// remembered failure **in the work's transaction** (with
    /// [`fail_in`](SqliteStore::fail_in)), and every retry gets it back as
    /// [`Error::Work`] without running. The work's writes made before it
    /// returned the remembered error commit with the failure.
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
        F: for<'c> FnOnce(&'c mut SqliteTx) -> TxFuture<'c, Result<T, E>> + Send,
    {
        idem.execute_in_store_tx_remembering(key, body, remember, || self.open_tx(), work)
            .await
    }

    async fn open_tx(&self) -> Result<LiteTx<'_>, StoreError> {
        Ok(LiteTx {
            store: self,
            tx: self.begin().await?,
        })
    }
}

/// A transaction on the store, as the shared driver in idem-core runs it.
struct LiteTx<'s> {
    store: &'s SqliteStore,
    tx: SqliteTx,
}

impl StoreTx for LiteTx<'_> {
    type Conn = SqliteTx;

    // Every write of the store waits for the transaction, a takeover
    // included, so no renewal is needed (and one would wait too).
    const HOLDS_THE_WRITER: bool = true;

    fn conn(&mut self) -> &mut SqliteTx {
        &mut self.tx
    }

    async fn settle(&mut self, lease: &Lease, state: State, payload: &[u8]) -> Result<(), Error> {
        self.store
            .settle_in(&mut self.tx, lease, state, payload)
            .await
    }

    async fn commit(self) -> Result<(), StoreError> {
        self.tx.commit().await
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
