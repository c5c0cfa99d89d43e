//! The runner: claims the key, takes it over when its owner is gone,
//! settles it as failed after too many takeovers, and hands the work its
//! [`Steps`].

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::machine::{decide, Decision};
use crate::store::{Insert, NewRecord, Record, State, Token};
use crate::{Error, Fingerprint, Idempotent, Key, Lease, When};

use super::journal::{replay_failure, Journal, PoisonedRecord};
use super::step::Steps;
use super::step::{Inner, Journaled};
use super::{Poisoned, DEFAULT_MAX_TAKEOVERS};
use crate::StepsError;

// As in `Idempotent::begin`: each lost takeover means another caller
// changed the record; a few rounds settle it.
const MAX_LOST_TAKEOVERS: usize = 8;

// The longest lease a caller that does not wait (no `with_wait`) still
// waits out instead of answering `InProgress`: a hand-over's (the
// shortest lease), with room for a slow store clock.
const HANDED_OVER: Duration = Duration::from_millis(10);

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
    /// * [`Error::InProgress`] while another call holds the key. A handle
    ///   made [`with_wait`](Idempotent::with_wait) waits instead, as
    ///   [`Idempotent::execute`] does: it replays the outcome once it is
    ///   recorded, or takes the key over once the lease lapses (a takeover
    ///   like any other, resuming after the last recorded step), so a retry
    ///   after a crash resumes as soon as the store allows.
    /// * [`Error::Mismatch`] at once, waiting or not, for another body.
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
        let retention = crate::store::clamp::retention(self.idem.retention(), lease);
        let mut waiter = self.idem.waiter();
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
            let left = match decide(&found, &fingerprint.into()) {
                Decision::Mismatch => return Err(Error::Mismatch),
                Decision::InProgress(left) => left,
                Decision::Replay if found.state == State::Failed => {
                    return Err(replay_failure(&found.payload))
                }
                Decision::Replay => {
                    return serde_json::from_slice(&found.payload)
                        .map(Claimed::Replayed)
                        .map_err(Error::Decode)
                }
                Decision::TakeOver(old) => match self.take_over(&key, old, &found, &claim).await? {
                    Some(journal) => {
                        return Ok(Claimed::Run(self.steps(key, token, fingerprint, journal)))
                    }
                    // Another caller changed the record: look again.
                    None if lost_takeovers < MAX_LOST_TAKEOVERS => {
                        lost_takeovers += 1;
                        continue;
                    }
                    None => lease,
                },
            };
            // As `Idempotent::begin` waits: until the record settles or the
            // lease lapses, and then the next look replays or takes over.
            if waiter.wait(&**store, key.as_str(), left).await {
                continue;
            }
            // A key handed over by a failed run has a lease of a moment:
            // wait that moment rather than refuse the resume.
            if left <= HANDED_OVER && lost_takeovers < MAX_LOST_TAKEOVERS {
                lost_takeovers += 1;
                tokio::time::sleep(left.max(crate::store::clamp::SHORTEST)).await;
                continue;
            }
            return Err(Error::InProgress { retry_after: left });
        }
    }

    /// Takes the key over from `old` with the journal of `found`: the
    /// journal to resume from, or `None` when another caller changed the
    /// record first. Settles the key as [`Poisoned`] instead once it has
    /// been taken over too often.
    async fn take_over<E>(
        &self,
        key: &Key,
        old: Token,
        found: &Record,
        claim: &NewRecord<'_>,
    ) -> Result<Option<Journal>, Error<E>> {
        let store = self.idem.store();
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
                state: State::Failed,
                payload: &payload,
                lease: None,
                retention: self.idem.retention(),
                ..*claim
            };
            return match store.take_over(key.as_str(), old, &settle).await {
                Ok(true) => {
                    tracing::warn!(%key, takeovers = poisoned.takeovers,
                        "durable steps taken over too often; settled as failed");
                    Err(Error::Steps(StepsError::Poisoned(poisoned)))
                }
                Ok(false) => Ok(None),
                Err(source) => Err(Error::store(source, When::BeforeWork)),
            };
        }
        let payload = journal.encode();
        let record = NewRecord {
            payload: &payload,
            ..*claim
        };
        match store.take_over(key.as_str(), old, &record).await {
            Ok(true) => Ok(Some(journal)),
            Ok(false) => Ok(None),
            Err(source) => Err(Error::store(source, When::BeforeWork)),
        }
    }

    fn steps(&self, key: Key, token: Token, fingerprint: Fingerprint, journal: Journal) -> Steps {
        let lease_length = self.idem.lease();
        let retention = crate::store::clamp::retention(self.idem.retention(), lease_length);
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
