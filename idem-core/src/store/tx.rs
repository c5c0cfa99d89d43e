//! The one driver of transactional completion that every SQL store shares:
//! claim, open a transaction, run the work in it, record the outcome with a
//! fenced write in the same transaction, commit.
//!
//! The policy (what is released, what is recorded, what the caller is told)
//! lives here once; a store supplies only its transaction, through
//! [`StoreTx`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::{State, StoreError};
use crate::{Begin, Error, Fingerprint, Idempotent, Lease, When};

/// The future a transactional work closure returns: boxed, because it
/// borrows the transaction's connection (the shape of sqlx's own
/// `Connection::transaction`). Write `|tx| Box::pin(async move { … })`.
pub type TxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// A transaction a store opened for
/// [`Idempotent::execute_in_store_tx`]: the connection the work writes
/// through, the fenced write that records the outcome inside it, and its
/// end.
///
/// For store implementers; applications call their store's
/// `execute_in_tx`.
pub trait StoreTx: Send + Sized {
    /// The connection the work gets: it can write, but it is not the
    /// transaction, so the work cannot commit or roll back what it does not
    /// own.
    type Conn: ?Sized + Send;

    /// Whether the open transaction holds the store's only writer, so that
    /// no other operation of the store, a takeover included, can run until
    /// it ends (SQLite's). The driver then runs no heartbeat around the
    /// work: nothing can take the lease over, and a renewal would wait for
    /// the transaction's end while the driver waits for the renewal.
    const HOLDS_THE_WRITER: bool = false;

    /// The transaction's connection.
    fn conn(&mut self) -> &mut Self::Conn;

    /// Records `payload` in `state` ([`State::Completed`] or
    /// [`State::Failed`]) for `lease` **inside** the transaction, fenced by
    /// the lease's token. MUST return [`Error::LeaseLost`], having written
    /// nothing, when the token no longer owns a live in-flight record.
    fn settle<'a>(
        &'a mut self,
        lease: &'a Lease,
        state: State,
        payload: &'a [u8],
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;

    /// Commits: the work's writes and the outcome become durable together.
    fn commit(self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls back (best effort: a transaction whose connection broke is
    /// rolled back by the server).
    fn rollback(self) -> impl Future<Output = ()> + Send;
}

/// A lease whose outcome a store wrote **inside a caller's transaction**
/// that has not ended yet: what the SQL stores' `complete_in` and
/// `fail_in` hand back, holding the lease they took by value.
///
/// End it with the transaction: [`commit`](Uncommitted::commit) (pass
/// `tx.commit()`) or [`rollback`](Uncommitted::rollback) (pass
/// `tx.rollback()`). A rollback or a drop gives the key back, as
/// `execute_in_tx` does when its work fails: neither the outcome nor the
/// transaction's writes landed, and the release is fenced by the token and
/// the in-flight state, so it frees the key only if this caller still owns
/// it and nothing committed. A dropped `Uncommitted` releases in a task
/// spawned on the current tokio runtime, which waits for the transaction to
/// end; after a commit that release changes nothing, so forgetting the
/// guard is never unsafe.
#[must_use = "end it with the transaction: `commit(tx.commit())` or `rollback(tx.rollback())`"]
pub struct Uncommitted {
    // `None` once ended.
    lease: Option<Lease>,
}

impl fmt::Debug for Uncommitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Uncommitted")
            .field("lease", &self.lease)
            .finish()
    }
}

impl Uncommitted {
    /// Wraps `lease`, whose outcome the store just wrote inside an open
    /// transaction. For store implementers.
    pub fn new(lease: Lease) -> Uncommitted {
        Uncommitted { lease: Some(lease) }
    }

    /// The lease whose outcome awaits the commit.
    pub fn lease(&self) -> &Lease {
        self.lease
            .as_ref()
            .expect("an Uncommitted holds its lease until it ends")
    }

    /// Takes the lease back without a release, for a caller that ends the
    /// transaction and settles the key itself (as the shared driver does):
    /// the key's fate is then the caller's.
    pub fn into_lease(mut self) -> Lease {
        self.lease
            .take()
            .expect("an Uncommitted holds its lease until it ends")
    }

    /// Awaits `commit` (the transaction's commit, `tx.commit()`) and
    /// returns what it returned. A failed commit may still have landed, so
    /// the key is then released fenced on the in-flight state: it goes back
    /// only if the outcome (and with it every write) did not land.
    pub async fn commit<E>(mut self, commit: impl Future<Output = Result<(), E>>) -> Result<(), E> {
        let committed = commit.await;
        let lease = self.lease.take().expect("an Uncommitted ends once");
        if committed.is_err() {
            release_after_rollback(&lease).await;
        }
        committed
    }

    /// Awaits `rollback` (the transaction's rollback, `tx.rollback()`),
    /// then gives the key back, and returns what the rollback returned.
    /// A rollback that failed still ended the transaction (the server rolls
    /// back a broken one), so the key is released either way; a release
    /// that fails is logged and the key waits for its lease to lapse.
    pub async fn rollback<T>(mut self, rollback: impl Future<Output = T>) -> T {
        let rolled_back = rollback.await;
        let lease = self.lease.take().expect("an Uncommitted ends once");
        release_after_rollback(&lease).await;
        rolled_back
    }
}

impl Drop for Uncommitted {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        // The release must not be awaited here (a drop cannot wait, and the
        // transaction may still be open, holding the record's row lock);
        // spawned, it waits for the transaction to end.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { release_after_rollback(&lease).await });
            }
            Err(_) => tracing::warn!(key = %lease.key(),
                "an Uncommitted was dropped outside a tokio runtime; \
                 the key stays claimed until its lease lapses"),
        }
    }
}

async fn release_after_rollback(lease: &Lease) {
    match lease.release().await {
        // Committed, or taken over: nothing of ours to give back.
        Ok(()) | Err(Error::LeaseLost) => {}
        Err(error) => tracing::warn!(key = %lease.key(), %error,
            "could not release the key after its transaction ended without committing"),
    }
}

impl Idempotent {
    /// Runs `work` once for `key` and `body` inside a transaction that
    /// `open` begins after the claim, records its outcome in that same
    /// transaction through [`StoreTx::settle`], and commits; replays the
    /// outcome to every retry. The driver behind the SQL stores'
    /// `execute_in_tx`.
    ///
    /// * `Ok(value)` is recorded and returned after the commit.
    /// * `Err(e)` rolls the work's writes back, releases the key and
    ///   returns [`Error::Work`].
    /// * A lease found lost while the work ran, or by the fenced write:
    ///   the transaction rolls back and the caller gets
    ///   [`Error::LeaseLost`] (or [`Error::Work`] if the work failed).
    /// * A failure to open the transaction releases the key
    ///   ([`When::BeforeWork`]); a failed fenced write or commit rolls
    ///   back and releases the key (the release is fenced on the in-flight
    ///   state, so after a commit that landed it changes nothing) and is
    ///   [`When::AfterWork`].
    ///
    /// A remembered failure found by the claim is [`Error::Remembered`].
    pub async fn execute_in_store_tx<X, B, T, E, O, Of, F>(
        &self,
        key: &str,
        body: &B,
        open: O,
        work: F,
    ) -> Result<T, Error<E>>
    where
        X: StoreTx,
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Send,
        O: FnOnce() -> Of + Send,
        Of: Future<Output = Result<X, StoreError>> + Send,
        F: for<'c> FnOnce(&'c mut X::Conn) -> TxFuture<'c, Result<T, E>> + Send,
    {
        self.transact(
            key,
            body,
            open,
            work,
            |_| None,
            |payload| match serde_json::from_slice(payload) {
                Ok(value) => Error::Remembered(value),
                Err(e) => Error::Decode(e),
            },
        )
        .await
    }

    /// Like [`execute_in_store_tx`](Idempotent::execute_in_store_tx), but a
    /// work error for which `remember` returns `true` is recorded as a
    /// remembered failure (`Failed`) **in the work's transaction**: the
    /// work's writes made before it returned the error commit together
    /// with the failure, and every retry gets the error back as
    /// [`Error::Work`] without running. Any other error rolls back and
    /// releases the key.
    ///
    /// If the failure cannot be recorded (the fenced write or the commit
    /// fails, or the error does not encode as JSON), the transaction rolls
    /// back, the key is released and the caller still gets
    /// [`Error::Work`]: nothing of the attempt landed, so a retry runs
    /// the work again.
    pub async fn execute_in_store_tx_remembering<X, B, T, E, R, O, Of, F>(
        &self,
        key: &str,
        body: &B,
        remember: R,
        open: O,
        work: F,
    ) -> Result<T, Error<E>>
    where
        X: StoreTx,
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Serialize + DeserializeOwned + Send,
        R: FnOnce(&E) -> bool + Send,
        O: FnOnce() -> Of + Send,
        Of: Future<Output = Result<X, StoreError>> + Send,
        F: for<'c> FnOnce(&'c mut X::Conn) -> TxFuture<'c, Result<T, E>> + Send,
    {
        self.transact(
            key,
            body,
            open,
            work,
            |error| remember(error).then(|| serde_json::to_vec(error)),
            decode_failure,
        )
        .await
    }

    /// The claim of a transactional call that remembers failures: like
    /// [`begin_json`](Idempotent::begin_json), but a remembered failure
    /// decodes into the work's error type and is [`Error::Work`], as
    /// [`execute_remembering`](Idempotent::execute_remembering) replays it.
    pub async fn begin_json_remembering<B, T, E>(
        &self,
        key: &str,
        body: &B,
    ) -> Result<crate::BeginJson<T>, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: DeserializeOwned,
        E: DeserializeOwned,
    {
        self.claim(key, body, decode_failure).await
    }

    async fn claim<B, T, E>(
        &self,
        key: &str,
        body: &B,
        replay_failure: impl FnOnce(&[u8]) -> Error<E> + Send,
    ) -> Result<crate::BeginJson<T>, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: DeserializeOwned,
    {
        let key = self.key(key).map_err(Error::into_work_error)?;
        let fingerprint = Fingerprint::of_json(body).map_err(Error::Encode)?;
        match self.begin_key(key, fingerprint.into()).await {
            Ok(Begin::Run(lease)) => Ok(crate::BeginJson::Run(lease)),
            Ok(Begin::Replay(replay)) if replay.is_failure() => {
                Err(replay_failure(replay.payload()))
            }
            Ok(Begin::Replay(replay)) => serde_json::from_slice(replay.payload())
                .map(crate::BeginJson::Replayed)
                .map_err(Error::Decode),
            Err(error) => Err(error.into_work_error()),
        }
    }

    async fn transact<X, B, T, E, O, Of, F>(
        &self,
        key: &str,
        body: &B,
        open: O,
        work: F,
        remember: impl FnOnce(&E) -> Option<serde_json::Result<Vec<u8>>> + Send,
        replay_failure: impl FnOnce(&[u8]) -> Error<E> + Send,
    ) -> Result<T, Error<E>>
    where
        X: StoreTx,
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Send,
        O: FnOnce() -> Of + Send,
        Of: Future<Output = Result<X, StoreError>> + Send,
        F: for<'c> FnOnce(&'c mut X::Conn) -> TxFuture<'c, Result<T, E>> + Send,
    {
        let lease = match self.claim(key, body, replay_failure).await? {
            crate::BeginJson::Run(lease) => lease,
            crate::BeginJson::Replayed(value) => return Ok(value),
        };
        let mut tx = match open().await {
            Ok(tx) => tx,
            Err(source) => {
                // Nothing ran: give the key back for the retry.
                let _ = lease.release().await;
                return Err(Error::store(source, When::BeforeWork));
            }
        };
        let ran = if X::HOLDS_THE_WRITER {
            crate::RunOutput {
                output: work(tx.conn()).await,
                lease_lost: false,
            }
        } else {
            lease.run(work(tx.conn())).await
        };
        let (state, payload, answer) = match ran.output {
            Ok(_) if ran.lease_lost => {
                tx.rollback().await;
                return Err(Error::LeaseLost);
            }
            Ok(value) => match serde_json::to_vec(&value) {
                Ok(payload) => (State::Completed, payload, Ok(value)),
                Err(encode) => {
                    // The transaction rolls back, so nothing happened: the
                    // key can go back.
                    tx.rollback().await;
                    let _ = lease.release().await;
                    return Err(Error::Encode(encode));
                }
            },
            Err(error) => {
                let remembered = if ran.lease_lost {
                    None
                } else {
                    remember(&error)
                };
                match remembered {
                    Some(Ok(payload)) => (State::Failed, payload, Err(Error::Work(error))),
                    other => {
                        if let Some(Err(encode)) = other {
                            tracing::warn!(key = %lease.key(), error = %encode,
                                "a failure to remember cannot be encoded; releasing the key");
                        }
                        tx.rollback().await;
                        release_after_failure(&lease).await;
                        return Err(Error::Work(error));
                    }
                }
            }
        };
        if let Err(settle) = tx.settle(&lease, state, &payload).await {
            tx.rollback().await;
            // Nothing of the attempt landed. A lost lease belongs to the
            // taker-over; otherwise the key goes back for the retry.
            if !matches!(settle, Error::LeaseLost) {
                release_after_failure(&lease).await;
            }
            return match answer {
                Err(work) => Err(work),
                Ok(_) => Err(settle.into_work_error()),
            };
        }
        match tx.commit().await {
            Ok(()) => answer,
            Err(source) => {
                // A commit cut off may still have happened. The release is
                // fenced on the in-flight state, so it frees the key only
                // if the outcome (and with it every business write) did not
                // land; otherwise it changes nothing and a retry replays.
                let _ = lease.release().await;
                match answer {
                    Err(work) => Err(work),
                    Ok(_) => Err(Error::store(source, When::AfterWork)),
                }
            }
        }
    }
}

fn decode_failure<E: DeserializeOwned>(payload: &[u8]) -> Error<E> {
    match serde_json::from_slice(payload) {
        Ok(error) => Error::Work(error),
        Err(e) => Error::Decode(e),
    }
}

async fn release_after_failure(lease: &Lease) {
    if let Err(settle) = lease.release().await {
        // The work's own error is what the caller must see; the key stays
        // claimed until its lease lapses.
        tracing::warn!(key = %lease.key(), error = %settle,
            "could not release the key after the work failed");
    }
}
