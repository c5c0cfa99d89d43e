//! Durable steps: a multi-step operation under one key that resumes after
//! a crash where it stopped.
//!
//! # Where the steps are kept, and why
//!
//! The journal of recorded steps is the **payload of the key's `InFlight`
//! record** (the design reserves that payload for "the progress of durable
//! steps"). Every write of it is a [`Store::swap`](crate::Store::swap) fenced by the owner's
//! token, so the [`Store`](crate::Store) trait is unchanged and every store that passes
//! the conformance kit holds steps:
//!
//! * *Recording a step* is one `swap` that keeps the record `InFlight`,
//!   writes the journal with the new step appended and renews the lease:
//!   one atomic operation, one round trip, refused to a stale owner.
//! * *The token rotates at every recorded step.* The swap expects the
//!   current token and writes a fresh one. A taker-over reads the journal
//!   from the record its claim found and takes over **from that record's
//!   token**, so its takeover succeeds only if no step was recorded since
//!   it read: the journal it resumes from is the one its takeover
//!   replaced, never an older one (the read-then-take-over race). Without
//!   the rotation a paused owner could record a step after the read and let
//!   its lease lapse again before the takeover, and the step would run
//!   twice.
//! * *The heartbeat writes the journal too*: a renewal is a `swap` and
//!   replaces the payload, so the steps' own heartbeat renews with the
//!   current journal (and the current token). Renewals and step records
//!   are serialized by one lock, so a renewal never writes an older journal
//!   over a newer one.
//! * *A takeover* writes the journal it found, with the takeover counted,
//!   in the same `take_over` (one atomic operation). Past
//!   [`Durable::with_max_takeovers`] takeovers (default
//!   [`DEFAULT_MAX_TAKEOVERS`]) that same `take_over` settles the key as
//!   `Failed` with the history ([`Poisoned`]) instead, so a poison
//!   operation that kills its worker cannot loop forever.
//!
//! The cost in round trips (counted in `idem-bench`): the claim and the
//! completion as for [`Idempotent::execute`], plus **one swap per recorded
//! step**; a replayed step costs nothing (the journal came with the claim).
//!
//! # What each kind of step guarantees across crashes
//!
//! * [`Steps::step`]: a step whose outcome is recorded is never run again
//!   under this key; one that crashes (or whose record is lost) after it
//!   ran is run again by the taker-over. Its effect is **at least once**
//!   across crashes — at most once per crash.
//! * [`Steps::remote`]: the same, and the work gets a key derived from the
//!   operation's key and the step's name ([`Lease::derive_key`]); a remote
//!   idempotent API dedupes the re-run, so the effect is **exactly once**.
//! * A step inside a SQL transaction (`step_in_tx` in `idem-postgres` and
//!   `idem-sqlite`): the journal swap runs in the transaction that holds
//!   the step's business writes, so both commit or neither does: **exactly
//!   once**. Those crates build on [`Steps::begin_step`] and
//!   [`StepWriter`].
//!
//! # Rules for the work
//!
//! * Steps run one after another, each awaited before the next starts;
//!   their order is the journal's order.
//! * The code between steps must be deterministic given the steps'
//!   outcomes: a resumed run must reach the same steps in the same order.
//!   A run whose step names or order differ from the recorded ones fails
//!   with [`StepsError::Diverged`] (the code changed under a running
//!   operation) instead of guessing; so does a run that finishes before
//!   reaching every recorded step.
//! * A step that fails (`Err`) is not recorded. When the work returns an
//!   error the key is not released (that would forget the recorded steps):
//!   its lease is cut to the shortest, so the next call takes it over at
//!   once and resumes after the last recorded step. Such a hand-over is not
//!   counted as a takeover.
//! * Every call for a key runs it through durable steps: a plain
//!   [`Idempotent::execute`] that takes such a key over starts from an
//!   empty payload and would run every step again.
//! * Waiting ([`Idempotent::with_wait`]) does not apply: a live key is
//!   [`Error::InProgress`] at once.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::machine::{decide, Decision};
use crate::{Error, Fingerprint, Idempotent, Insert, Key, Lease, NewRecord, State, Token, When};

/// How many times a key may be taken over (its owner crashed or stalled
/// past its lease) before it is settled as failed.
pub const DEFAULT_MAX_TAKEOVERS: u32 = 10;

// As in `Idempotent::begin`: each lost takeover means another caller
// changed the record; a few rounds settle it.
const MAX_LOST_TAKEOVERS: usize = 8;

// The longest lease a caller waits out instead of answering `InProgress`:
// a hand-over's (the shortest lease), with room for a slow store clock.
const HANDED_OVER: Duration = Duration::from_millis(10);

// Marks a payload as a step journal, with the version of its layout.
const JOURNAL_VERSION: u32 = 1;

/// Why a durable-steps run stopped that is about the steps themselves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepsError {
    /// The run reached different steps, or in another order, than the ones
    /// recorded under the key: the code changed under a running operation.
    /// Nothing was recorded; the key is handed to the next call, which
    /// resumes if its code matches the journal.
    #[error(
        "the steps differ from the ones recorded under this key at step {position}: \
         recorded {recorded:?}, this run {}; the code changed under a running operation",
        requested.as_deref().map_or_else(|| "ended there".to_owned(), |n| format!("asked for {n:?}"))
    )]
    Diverged {
        /// The index (from 0) of the first step that differs.
        position: usize,
        /// The name recorded at that position.
        recorded: String,
        /// The name this run asked for there, or `None` if the run finished
        /// before reaching it.
        requested: Option<String>,
    },
    /// The key was taken over more times than allowed and is settled as
    /// failed; every later call gets this again.
    #[error(
        "the operation was taken over {} times (its workers kept dying) and is settled as failed; steps recorded: {:?}",
        .0.takeovers, .0.steps
    )]
    Poisoned(Poisoned),
    /// An earlier step of this run could not be recorded (its lease was
    /// lost, or the store failed after the step ran); the run cannot go on.
    /// A retry resumes from what the store holds.
    #[error("an earlier step of this run could not be recorded; retry to resume from the store")]
    Interrupted,
}

/// The history kept with a key settled as failed after too many takeovers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Poisoned {
    /// How many times the key had been taken over.
    pub takeovers: u32,
    /// The names of the steps recorded by then, in order.
    pub steps: Vec<String>,
}

/// The payload of a poisoned key's `Failed` record.
#[derive(Serialize, Deserialize)]
struct PoisonedRecord {
    idem_poisoned: Poisoned,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Journal {
    idem_steps: u32,
    takeovers: u32,
    #[serde(default)]
    handed_over: bool,
    steps: Vec<Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    name: String,
    outcome: serde_json::Value,
}

impl Journal {
    fn fresh() -> Journal {
        Journal {
            idem_steps: JOURNAL_VERSION,
            ..Journal::default()
        }
    }

    /// An empty payload is a key claimed by a plain call or a fresh claim.
    fn decode(payload: &[u8]) -> serde_json::Result<Journal> {
        if payload.is_empty() {
            return Ok(Journal::fresh());
        }
        serde_json::from_slice(payload)
    }

    fn encode(&self) -> Vec<u8> {
        // A journal holds strings and JSON values only: it always encodes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Runs durable steps: [`Idempotent::execute`] for work made of several
/// recorded steps. Made by [`Idempotent::durable`].
#[derive(Debug, Clone)]
pub struct Durable {
    idem: Idempotent,
    max_takeovers: u32,
}

impl Idempotent {
    /// Durable steps on this handle's store and settings, allowing
    /// [`DEFAULT_MAX_TAKEOVERS`] takeovers. See [`Durable::execute`].
    pub fn durable(&self) -> Durable {
        Durable {
            idem: self.clone(),
            max_takeovers: DEFAULT_MAX_TAKEOVERS,
        }
    }

    /// Shorthand for `self.durable().execute(key, body, work)`.
    pub async fn execute_steps<B, T, E, F, Fut>(
        &self,
        key: &str,
        body: &B,
        work: F,
    ) -> Result<T, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Send,
        F: FnOnce(Steps) -> Fut + Send,
        Fut: Future<Output = Result<T, Error<E>>> + Send,
    {
        self.durable().execute(key, body, work).await
    }
}

/// What a claim found, for a durable run.
enum Claimed<T> {
    Run(Steps),
    Replayed(T),
}

impl Durable {
    /// Settles a key as failed once it has been taken over more than `n`
    /// times (its workers kept dying or stalling past the lease).
    pub fn with_max_takeovers(mut self, n: u32) -> Durable {
        self.max_takeovers = n;
        self
    }

    /// Runs `work` for `key` and `body` as a sequence of recorded steps and
    /// records its outcome; replays the outcome to every retry.
    ///
    /// `work` gets a [`Steps`] context. On a first run every step runs and
    /// is recorded before the next starts. A call that takes the key over
    /// (the owner crashed and its lease lapsed) replays the recorded steps'
    /// outcomes without running them and runs the rest. See the
    /// [module docs](crate::steps) for what each kind of step guarantees.
    ///
    /// * `Ok(value)` is recorded as `Completed` and returned.
    /// * An error from `work` (for example a step's [`Error::Work`]) is
    ///   returned; the recorded steps are kept and the key is handed to the
    ///   next call at once, which resumes after the last recorded step.
    /// * [`StepsError::Diverged`] when the run's steps differ from the
    ///   recorded ones; [`StepsError::Poisoned`] once the key was taken over
    ///   more than the allowed number of times (to this call and every later
    ///   one).
    ///
    /// ```
    /// use idem_core::{Error, Idempotent, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let idem = Idempotent::new(MemoryStore::new());
    /// let total: Result<u32, Error<String>> = idem
    ///     .execute_steps("order-7f3a", "body", |steps| async move {
    ///         let stock: u32 = steps.step("reserve", || async { Ok(3) }).await?;
    ///         let charge: u32 = steps
    ///             .remote("charge", |derived_key| async move {
    ///                 // Send `derived_key` as the gateway's idempotency key.
    ///                 assert!(derived_key.starts_with("idem-"));
    ///                 Ok(1250)
    ///             })
    ///             .await?;
    ///         Ok(stock + charge)
    ///     })
    ///     .await;
    /// assert_eq!(total.unwrap(), 1253);
    /// # }
    /// ```
    pub async fn execute<B, T, E, F, Fut>(
        &self,
        key: &str,
        body: &B,
        work: F,
    ) -> Result<T, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Send,
        F: FnOnce(Steps) -> Fut + Send,
        Fut: Future<Output = Result<T, Error<E>>> + Send,
    {
        let key = self.idem.key(key).map_err(Error::into_work_error)?;
        let fingerprint = Fingerprint::of_json(body).map_err(Error::Encode)?;
        let steps = match self.claim(key, fingerprint).await? {
            Claimed::Run(steps) => steps,
            Claimed::Replayed(value) => return Ok(value),
        };

        let outcome = {
            let mut work = pin!(work(steps.clone()));
            let heartbeat = pin!(steps.heartbeat());
            tokio::select! {
                biased;
                outcome = &mut work => outcome,
                // The lease was lost (or a write of this run stopped it):
                // the work is finished, as `Lease::run` does, but its
                // outcome is not recorded.
                () = heartbeat => match work.await {
                    Err(error) => return Err(error),
                    Ok(_) => return Err(Error::LeaseLost),
                },
            }
        };
        let outcome = match outcome {
            Ok(value) => match serde_json::to_vec(&value) {
                Ok(payload) => steps.complete(&payload).await.map(|()| value),
                // The key stays claimed until its lease lapses: the steps
                // ran, and their journal must not be forgotten.
                Err(encode) => Err(Error::Encode(encode)),
            },
            Err(error) => Err(error),
        };
        match outcome {
            Ok(value) => Ok(value),
            Err(error) => {
                if matches!(
                    error,
                    Error::Work(_) | Error::Steps(StepsError::Diverged { .. })
                ) {
                    steps.hand_over().await;
                }
                Err(error)
            }
        }
    }

    async fn claim<T, E>(&self, key: Key, fingerprint: Fingerprint) -> Result<Claimed<T>, Error<E>>
    where
        T: DeserializeOwned,
    {
        let store = self.idem.store();
        let lease = self.idem.lease();
        let retention = crate::clamp::retention(self.idem.retention(), lease);
        let mut lost_takeovers = 0;
        loop {
            let token = Token::random();
            let claim = NewRecord {
                token,
                fingerprint,
                state: State::InFlight,
                payload: &[],
                lease: Some(lease),
                retention,
            };
            let found = match store.insert(key.as_str(), &claim).await {
                Ok(Insert::Inserted) => {
                    return Ok(Claimed::Run(self.steps(
                        key,
                        token,
                        fingerprint,
                        Journal::fresh(),
                    )))
                }
                Ok(Insert::Found(found)) => found,
                Err(source) => return Err(Error::store(source, When::BeforeWork)),
            };
            let old = match decide(&found, &fingerprint.into()) {
                Decision::Mismatch => return Err(Error::Mismatch),
                // A key handed over by a failed run has a lease of a
                // moment: wait that moment rather than refuse the resume.
                Decision::InProgress(left)
                    if left <= HANDED_OVER && lost_takeovers < MAX_LOST_TAKEOVERS =>
                {
                    lost_takeovers += 1;
                    tokio::time::sleep(left.max(crate::clamp::SHORTEST)).await;
                    continue;
                }
                Decision::InProgress(retry_after) => return Err(Error::InProgress { retry_after }),
                Decision::Replay if found.state == State::Failed => {
                    return Err(replay_failure(&found.payload))
                }
                Decision::Replay => {
                    return serde_json::from_slice(&found.payload)
                        .map(Claimed::Replayed)
                        .map_err(Error::Decode)
                }
                Decision::TakeOver(old) => old,
            };
            // The journal read here is the one the takeover replaces: every
            // recorded step rotates the token, so a step recorded since this
            // read makes the takeover below fail.
            let mut journal = Journal::decode(&found.payload).map_err(Error::Decode)?;
            if !journal.handed_over {
                journal.takeovers += 1;
            }
            journal.handed_over = false;
            if journal.takeovers > self.max_takeovers {
                let poisoned = Poisoned {
                    takeovers: journal.takeovers,
                    steps: journal.steps.iter().map(|s| s.name.clone()).collect(),
                };
                let payload = serde_json::to_vec(&PoisonedRecord {
                    idem_poisoned: poisoned.clone(),
                })
                .map_err(Error::Encode)?;
                let settle = NewRecord {
                    token,
                    fingerprint,
                    state: State::Failed,
                    payload: &payload,
                    lease: None,
                    retention: self.idem.retention(),
                };
                match store.take_over(key.as_str(), old, &settle).await {
                    Ok(true) => {
                        tracing::warn!(%key, takeovers = poisoned.takeovers,
                            "durable steps taken over too often; settled as failed");
                        return Err(Error::Steps(StepsError::Poisoned(poisoned)));
                    }
                    Ok(false) if lost_takeovers < MAX_LOST_TAKEOVERS => {
                        lost_takeovers += 1;
                        continue;
                    }
                    Ok(false) => return Err(Error::InProgress { retry_after: lease }),
                    Err(source) => return Err(Error::store(source, When::BeforeWork)),
                }
            }
            let payload = journal.encode();
            let record = NewRecord {
                payload: &payload,
                ..claim
            };
            match store.take_over(key.as_str(), old, &record).await {
                Ok(true) => return Ok(Claimed::Run(self.steps(key, token, fingerprint, journal))),
                Ok(false) if lost_takeovers < MAX_LOST_TAKEOVERS => lost_takeovers += 1,
                Ok(false) => return Err(Error::InProgress { retry_after: lease }),
                Err(source) => return Err(Error::store(source, When::BeforeWork)),
            }
        }
    }

    fn steps(&self, key: Key, token: Token, fingerprint: Fingerprint, journal: Journal) -> Steps {
        let lease_length = self.idem.lease();
        let retention = crate::clamp::retention(self.idem.retention(), lease_length);
        let lease = Lease::new(
            Arc::clone(self.idem.store()),
            key,
            token,
            fingerprint,
            lease_length,
            retention,
        );
        let payload = journal.encode();
        Steps {
            inner: Arc::new(Inner {
                final_retention: self.idem.retention(),
                lease,
                state: Arc::new(Mutex::new(Journaled {
                    token,
                    journal,
                    payload,
                    cursor: 0,
                    stopped: false,
                })),
            }),
        }
    }
}

fn replay_failure<E>(payload: &[u8]) -> Error<E> {
    if let Ok(record) = serde_json::from_slice::<PoisonedRecord>(payload) {
        return Error::Steps(StepsError::Poisoned(record.idem_poisoned));
    }
    match serde_json::from_slice(payload) {
        Ok(value) => Error::Remembered(value),
        Err(e) => Error::Decode(e),
    }
}

/// The steps context the work of [`Durable::execute`] gets: run each
/// effect through [`step`](Steps::step) (or [`remote`](Steps::remote), or a
/// store's `step_in_tx`). Cheap to clone; every clone is the same run.
#[derive(Clone)]
pub struct Steps {
    inner: Arc<Inner>,
}

struct Inner {
    /// The run's lease as it was claimed: key, fingerprint, lengths. Its
    /// token is the first one; the current one is in `state`.
    lease: Lease,
    final_retention: Duration,
    state: Arc<Mutex<Journaled>>,
}

struct Journaled {
    token: Token,
    journal: Journal,
    /// `journal`, encoded: what every renewal writes.
    payload: Vec<u8>,
    /// How many recorded steps this run has passed.
    cursor: usize,
    /// A write was lost or may not have landed: no more writes.
    stopped: bool,
}

impl fmt::Debug for Steps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steps")
            .field("key", self.inner.lease.key())
            .finish_non_exhaustive()
    }
}

/// What [`Steps::begin_step`] found.
#[derive(Debug)]
pub enum StepStart<S> {
    /// The step is recorded: here is its outcome; do not run it.
    Replayed(S),
    /// The step is not recorded: run it, then record its outcome with
    /// [`PendingStep::writer`].
    Run(PendingStep),
}

/// A step that is to run and be recorded. See [`Steps::begin_step`].
#[derive(Debug)]
pub struct PendingStep {
    steps: Steps,
    name: String,
}

impl Steps {
    /// The key of the whole operation.
    pub fn key(&self) -> &Key {
        self.inner.lease.key()
    }

    /// The key to send a remote idempotent API for the step `name`: derived
    /// from the operation's key and `name` ([`Lease::derive_key`]), the
    /// same on every run and after every takeover.
    pub fn derive_key(&self, name: &str) -> String {
        self.inner.lease.derive_key(name)
    }

    /// How many steps are recorded under the key so far.
    pub async fn recorded(&self) -> usize {
        self.inner.state.lock().await.journal.steps.len()
    }

    /// How many times the key has been taken over, as of this run.
    pub async fn takeovers(&self) -> u32 {
        self.inner.state.lock().await.journal.takeovers
    }

    /// Runs the step `name` unless its outcome is recorded, then records
    /// its outcome (fenced by this run's token) before returning it.
    ///
    /// A recorded step returns its recorded outcome and `work` does not
    /// run. An unrecorded one runs; `Ok` is recorded (one store round trip)
    /// and returned; `Err(e)` is [`Error::Work`] and nothing is recorded.
    /// Across crashes the effect of `work` is **at least once**: a crash
    /// after it ran and before its record landed runs it again on resume.
    ///
    /// Errors: [`StepsError::Diverged`] when another step is recorded at
    /// this position; [`Error::LeaseLost`] when the key was taken over (the
    /// outcome is not recorded); [`Error::Store`] with
    /// [`When::AfterWork`] when the record failed after the step ran;
    /// [`Error::Decode`] when a recorded outcome does not decode into `S`.
    pub async fn step<S, E, F, Fut>(&self, name: &str, work: F) -> Result<S, Error<E>>
    where
        S: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<S, E>>,
    {
        let pending = match self
            .begin_step(name)
            .await
            .map_err(Error::into_work_error)?
        {
            StepStart::Replayed(value) => return Ok(value),
            StepStart::Run(pending) => pending,
        };
        let value = work().await.map_err(Error::Work)?;
        let mut writer = pending.writer().await.map_err(Error::into_work_error)?;
        let payload = writer.encode(&value).map_err(Error::Encode)?;
        let record = writer.record(&payload);
        let store = &self.inner.lease.store_arc();
        match store.swap(writer.key(), writer.expected(), &record).await {
            Ok(true) => {
                writer.committed();
                Ok(value)
            }
            Ok(false) => {
                writer.lost();
                Err(Error::LeaseLost)
            }
            Err(source) => Err(Error::store(source, When::AfterWork)),
        }
    }

    /// A step that calls a remote idempotent API: `work` gets the key to
    /// send it ([`derive_key`](Steps::derive_key)`(name)`), so a step run
    /// again after a crash sends the same key and the remote API runs the
    /// effect **exactly once**. Otherwise as [`step`](Steps::step).
    pub async fn remote<S, E, F, Fut>(&self, name: &str, work: F) -> Result<S, Error<E>>
    where
        S: Serialize + DeserializeOwned,
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<S, E>>,
    {
        let key = self.derive_key(name);
        self.step(name, || work(key)).await
    }

    /// The first half of a step, for a store that records the step inside
    /// its own transaction: the recorded outcome, or the right to run the
    /// step and record it.
    ///
    /// Errors: [`StepsError::Diverged`] when another step is recorded here,
    /// [`StepsError::Interrupted`] when an earlier write of this run was
    /// lost, [`Error::Decode`] when the recorded outcome does not decode.
    pub async fn begin_step<S: DeserializeOwned>(&self, name: &str) -> Result<StepStart<S>, Error> {
        let mut state = self.inner.state.lock().await;
        if state.stopped {
            return Err(Error::Steps(StepsError::Interrupted));
        }
        let position = state.cursor;
        match state.journal.steps.get(position) {
            Some(entry) if entry.name == name => {
                let value = S::deserialize(&entry.outcome).map_err(Error::Decode)?;
                state.cursor += 1;
                Ok(StepStart::Replayed(value))
            }
            Some(entry) => Err(Error::Steps(StepsError::Diverged {
                position,
                recorded: entry.name.clone(),
                requested: Some(name.to_owned()),
            })),
            None => Ok(StepStart::Run(PendingStep {
                steps: self.clone(),
                name: name.to_owned(),
            })),
        }
    }

    /// Renews the lease every heartbeat with the current journal; returns
    /// once the lease is lost or a write of this run stopped it.
    async fn heartbeat(&self) {
        let lease = &self.inner.lease;
        let every = lease.heartbeat_interval();
        loop {
            tokio::time::sleep(every).await;
            let mut state = self.inner.state.lock().await;
            if state.stopped {
                return;
            }
            let record = NewRecord {
                token: state.token,
                ..lease.record(State::InFlight, &state.payload)
            };
            match lease
                .store_arc()
                .swap(lease.key().as_str(), state.token, &record)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    state.stopped = true;
                    tracing::warn!(key = %lease.key(), "lease lost while durable steps ran");
                    return;
                }
                Err(error) => tracing::warn!(key = %lease.key(), %error, "lease renewal failed"),
            }
        }
    }

    async fn complete<E>(&self, payload: &[u8]) -> Result<(), Error<E>> {
        let mut state = self.inner.state.lock().await;
        if state.stopped {
            return Err(Error::Steps(StepsError::Interrupted));
        }
        if let Some(entry) = state.journal.steps.get(state.cursor) {
            // The run finished before a recorded step: it is not the run
            // that recorded them.
            return Err(Error::Steps(StepsError::Diverged {
                position: state.cursor,
                recorded: entry.name.clone(),
                requested: None,
            }));
        }
        let lease = &self.inner.lease;
        let record = NewRecord {
            token: state.token,
            retention: self.inner.final_retention,
            ..lease.record(State::Completed, payload)
        };
        match lease
            .store_arc()
            .swap(lease.key().as_str(), state.token, &record)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => {
                state.stopped = true;
                Err(Error::LeaseLost)
            }
            Err(source) => Err(Error::store(source, When::AfterWork)),
        }
    }

    /// Keeps the journal and cuts the lease to the shortest, so the next
    /// call takes the key over at once and resumes; not counted as a
    /// takeover.
    async fn hand_over(&self) {
        let mut state = self.inner.state.lock().await;
        if state.stopped {
            return;
        }
        state.journal.handed_over = true;
        let payload = state.journal.encode();
        let lease = &self.inner.lease;
        let record = NewRecord {
            token: state.token,
            lease: Some(crate::clamp::SHORTEST),
            ..lease.record(State::InFlight, &payload)
        };
        match lease
            .store_arc()
            .swap(lease.key().as_str(), state.token, &record)
            .await
        {
            Ok(true) => state.payload = payload,
            Ok(false) => state.stopped = true,
            Err(error) => {
                tracing::warn!(key = %lease.key(), %error,
                    "could not hand the key over after the work failed; it is taken over once its lease lapses");
            }
        }
        state.stopped = true;
    }
}

impl PendingStep {
    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes the right to write the journal: while the writer lives no
    /// renewal runs (so none can write an older journal over the one this
    /// step records). Take it once the step's work is done, or, for work
    /// that runs in a short synchronous transaction, just before.
    pub async fn writer(self) -> Result<StepWriter, Error> {
        let guard = Arc::clone(&self.steps.inner.state).lock_owned().await;
        if guard.stopped {
            return Err(Error::Steps(StepsError::Interrupted));
        }
        Ok(StepWriter {
            state: guard,
            steps: self.steps,
            name: self.name,
            token: Token::random(),
            written: None,
        })
    }
}

/// The right to record one step's outcome in the journal, held until the
/// write is known to have landed or not. A store's `step_in_tx` gets one
/// from [`PendingStep::writer`], writes [`record`](StepWriter::record)
/// with a compare-and-set on [`expected`](StepWriter::expected) inside its
/// transaction, and then calls [`committed`](StepWriter::committed) or
/// [`lost`](StepWriter::lost). Dropped without either (the commit failed
/// and may or may not have landed), it stops the run: later steps are
/// [`StepsError::Interrupted`] and a retry resumes from the store.
pub struct StepWriter {
    state: OwnedMutexGuard<Journaled>,
    steps: Steps,
    name: String,
    token: Token,
    written: Option<Journal>,
}

impl fmt::Debug for StepWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepWriter")
            .field("key", self.steps.key())
            .field("step", &self.name)
            .finish_non_exhaustive()
    }
}

impl StepWriter {
    /// The encoded key the journal is written under.
    pub fn key(&self) -> &str {
        self.steps.key().as_str()
    }

    /// The token the write must find (compare-and-set).
    pub fn expected(&self) -> Token {
        self.state.token
    }

    /// The journal with `outcome` appended as this step's: the payload to
    /// write with [`record`](StepWriter::record).
    pub fn encode<S: Serialize>(&mut self, outcome: &S) -> serde_json::Result<Vec<u8>> {
        let outcome = serde_json::to_value(outcome)?;
        let mut journal = self.state.journal.clone();
        journal.steps.push(Entry {
            name: self.name.clone(),
            outcome,
        });
        let payload = journal.encode();
        self.written = Some(journal);
        Ok(payload)
    }

    /// A copy of what [`encode`](StepWriter::encode) needs, to encode on
    /// another thread (a store's writer thread).
    pub fn encoder(&self) -> StepEncoder {
        StepEncoder {
            journal: self.state.journal.clone(),
            name: self.name.clone(),
        }
    }

    /// The record to write: `InFlight`, `payload`, a fresh token (the token
    /// rotates at every step), the lease renewed.
    pub fn record<'a>(&self, payload: &'a [u8]) -> NewRecord<'a> {
        NewRecord {
            token: self.token,
            ..self.steps.inner.lease.record(State::InFlight, payload)
        }
    }

    /// The write landed: the step is recorded.
    pub fn committed(mut self) {
        if let Some(journal) = self.written.take() {
            self.apply(journal);
        }
    }

    /// The write landed with this payload (as built by a [`StepEncoder`]).
    pub fn committed_with(mut self, payload: &[u8]) {
        match Journal::decode(payload) {
            Ok(journal) => self.apply(journal),
            Err(_) => self.state.stopped = true,
        }
    }

    fn apply(&mut self, journal: Journal) {
        self.state.token = self.token;
        self.state.payload = journal.encode();
        self.state.journal = journal;
        self.state.cursor += 1;
        self.written = None;
        // Marks this writer as finished for `Drop`.
        self.name.clear();
    }

    /// The write found another token: the key was taken over. The run
    /// stops; the caller gets [`Error::LeaseLost`].
    pub fn lost(mut self) {
        self.state.stopped = true;
        self.name.clear();
    }

    /// Nothing was written (the step's work failed and its transaction
    /// rolled back): the journal is as it was and the run may go on.
    pub fn unchanged(mut self) {
        self.name.clear();
    }
}

impl Drop for StepWriter {
    fn drop(&mut self) {
        if !self.name.is_empty() {
            // Whether the write landed is unknown.
            self.state.stopped = true;
        }
    }
}

/// Encodes a step's journal away from its [`StepWriter`] (on a store's
/// writer thread); hand the payload back with
/// [`StepWriter::committed_with`].
#[derive(Debug, Clone)]
pub struct StepEncoder {
    journal: Journal,
    name: String,
}

impl StepEncoder {
    /// The journal with `outcome` appended as this step's.
    pub fn encode<S: Serialize>(&self, outcome: &S) -> serde_json::Result<Vec<u8>> {
        let mut journal = self.journal.clone();
        journal.steps.push(Entry {
            name: self.name.clone(),
            outcome: serde_json::to_value(outcome)?,
        });
        Ok(journal.encode())
    }
}
