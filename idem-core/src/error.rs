//! The errors `execute` and the begin/complete API return.

use std::convert::Infallible;
use std::time::Duration;

use crate::steps::Poisoned;
use crate::store::StoreError;
use crate::KeyError;

/// When a store failure happened, relative to the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum When {
    /// Before the work ran: nothing happened, a retry is safe.
    BeforeWork,
    /// After the work ran: its side effect happened but its outcome may not
    /// be recorded. The key stays claimed until its lease lapses.
    AfterWork,
}

/// Everything that can stop an idempotent call from returning the work's
/// value. `E` is the work's own error type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E = Infallible> {
    /// The key breaks the rules; nothing was touched and the work did not
    /// run.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[from] KeyError),
    /// The key was first used with a different request. Use a new key for a
    /// new request.
    #[error("this idempotency key was used for a different request; use a new key")]
    Mismatch,
    /// Another caller holds the key and is running the work now.
    #[error(
        "a request with this idempotency key is still in progress; retry after {retry_after:?}"
    )]
    InProgress {
        /// The time left on the other caller's lease.
        retry_after: Duration,
    },
    /// The work ran and returned this error. Unless the call remembers
    /// failures, the key was released and a retry runs the work again.
    #[error("the work failed: {0}")]
    Work(E),
    /// An earlier call under this key failed and asked for its error to be
    /// remembered; this is that error, as JSON. Returned where the caller's
    /// error type cannot be decoded from storage (`execute`); see
    /// `execute_remembering`.
    #[error("an earlier call under this key failed and its failure is remembered: {0}")]
    Remembered(serde_json::Value),
    /// The work ran, but this caller no longer held the key when it came to
    /// record the outcome: its lease lapsed and another caller took the key
    /// over (whose outcome stands), or the store lost the record (a restarted
    /// server without persistence). This caller's outcome was not recorded.
    #[error("the lease on this idempotency key was lost (taken over by another caller, or the record is gone); this call's outcome was not recorded")]
    LeaseLost,
    /// The store failed. `when` says whether the work had run.
    #[error("{}", store_message(*.when))]
    Store {
        /// The store's error.
        #[source]
        source: StoreError,
        /// Whether the work had run when the store failed.
        when: When,
    },
    /// A recorded outcome does not decode into the type asked for: the
    /// outcome type changed since it was recorded, or the record is damaged.
    #[error("the recorded outcome does not decode into the requested type: {0}")]
    Decode(#[source] serde_json::Error),
    /// The request body or the work's outcome cannot be encoded as JSON.
    #[error("cannot encode as JSON: {0}")]
    Encode(#[source] serde_json::Error),
    /// Durable steps stopped: the steps differ from the recorded ones, the
    /// key was taken over too often, or an earlier step could not be
    /// recorded (see [`StepsError`]).
    #[error("{0}")]
    Steps(StepsError),
}

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

fn store_message(when: When) -> &'static str {
    match when {
        When::BeforeWork => "the idempotency store failed before the work ran; it is safe to retry",
        When::AfterWork => {
            "the idempotency store failed after the work ran; its outcome may not be recorded"
        }
    }
}

impl<E> Error<E> {
    /// Whether the work ran in this call (its side effect may have happened).
    pub fn work_ran(&self) -> bool {
        matches!(
            self,
            Error::Work(_)
                | Error::LeaseLost
                | Error::Store {
                    when: When::AfterWork,
                    ..
                }
        )
    }

    pub(crate) fn store(source: StoreError, when: When) -> Error<E> {
        Error::Store { source, when }
    }
}

impl Error<Infallible> {
    /// Turns an error of the begin/complete API, which has no work error,
    /// into one for any work error type.
    pub fn into_work_error<E>(self) -> Error<E> {
        match self {
            Error::InvalidKey(e) => Error::InvalidKey(e),
            Error::Mismatch => Error::Mismatch,
            Error::InProgress { retry_after } => Error::InProgress { retry_after },
            Error::Work(never) => match never {},
            Error::Remembered(value) => Error::Remembered(value),
            Error::LeaseLost => Error::LeaseLost,
            Error::Store { source, when } => Error::Store { source, when },
            Error::Decode(e) => Error::Decode(e),
            Error::Encode(e) => Error::Encode(e),
            Error::Steps(e) => Error::Steps(e),
        }
    }
}
