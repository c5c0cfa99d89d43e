//! What the work sees: [`Steps`], which replays a recorded step or runs
//! and records a new one.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::store::{NewRecord, State, Token};
use crate::{Error, Key, Lease, When};

use super::journal::Journal;
use super::writer::StepWriter;
use crate::StepsError;

/// The steps context the work of [`Durable::execute`](crate::Durable::execute) gets: run each
/// effect through [`step`](Steps::step) (or [`remote`](Steps::remote), or a
/// store's `step_in_tx`). Cheap to clone; every clone is the same run.
#[derive(Clone)]
pub struct Steps {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    /// The run's lease as it was claimed: key, fingerprint, lengths. Its
    /// token is the first one; the current one is in `state`.
    pub(super) lease: Lease,
    pub(super) final_retention: Duration,
    pub(super) state: Arc<Mutex<Journaled>>,
}

pub(super) struct Journaled {
    pub(super) token: Token,
    pub(super) journal: Journal,
    /// `journal`, encoded: what every renewal writes.
    pub(super) payload: Vec<u8>,
    /// How many recorded steps this run has passed.
    pub(super) cursor: usize,
    /// A write was lost or may not have landed: no more writes.
    pub(super) stopped: bool,
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
    pub(super) steps: Steps,
    pub(super) name: String,
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
    pub(super) async fn heartbeat(&self) {
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

    pub(super) async fn complete<E>(&self, payload: &[u8]) -> Result<(), Error<E>> {
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
    pub(super) async fn hand_over(&self) {
        let mut state = self.inner.state.lock().await;
        if state.stopped {
            return;
        }
        state.journal.handed_over = true;
        let payload = state.journal.encode();
        let lease = &self.inner.lease;
        let record = NewRecord {
            token: state.token,
            lease: Some(crate::store::clamp::SHORTEST),
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
