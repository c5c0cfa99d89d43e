//! The begin/complete API for frameworks: a claimed key is a [`Lease`], a
//! recorded one is a [`Replay`].

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use crate::observe::{Observe, TracedKey};
use crate::store::{State, Store, Token};
use crate::{Error, Fingerprint, Key, When};

/// What [`Idempotent::begin`](crate::Idempotent::begin) decided.
#[derive(Debug)]
#[non_exhaustive]
pub enum Begin {
    /// The key is yours: run the work, then [`complete`](Lease::complete),
    /// [`fail`](Lease::fail) or [`release`](Lease::release).
    Run(Lease),
    /// The outcome is recorded: return it without running anything.
    Replay(Replay),
}

/// A recorded outcome found by [`begin`](crate::Idempotent::begin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    failed: bool,
    payload: Vec<u8>,
}

impl Replay {
    pub(crate) fn new(state: State, payload: Vec<u8>) -> Replay {
        Replay {
            failed: state == State::Failed,
            payload,
        }
    }

    /// Whether the recorded outcome is a remembered failure
    /// ([`Lease::fail`]) rather than a success.
    pub fn is_failure(&self) -> bool {
        self.failed
    }

    /// The payload exactly as it was recorded.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload, by value.
    pub fn into_payload(self) -> Vec<u8> {
        self.payload
    }
}

/// What [`Lease::run`] returns: the work's output, and whether the lease
/// was found lost while it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOutput<T> {
    /// What the work returned.
    pub output: T,
    /// Whether a renewal found the lease lost while the work ran; if so
    /// the outcome must not be recorded.
    pub lease_lost: bool,
}

/// The right to run the work for one key, fenced by a token.
///
/// Every method is a compare-and-set on the token: once another caller has
/// taken the key over (because this lease lapsed), they all return
/// [`Error::LeaseLost`] and change nothing. Dropping a `Lease` without
/// finishing it leaves the key claimed until the lease lapses: the work may
/// have had its side effect, so nothing is released early.
#[derive(Clone)]
pub struct Lease {
    store: Arc<dyn Store>,
    key: Key,
    token: Token,
    fingerprint: Fingerprint,
    lease: Duration,
    retention: Duration,
    // Labels for the work's duration and how logs show the key.
    observe: Option<Observe>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        key: Key,
        token: Token,
        fingerprint: Fingerprint,
        lease: Duration,
        retention: Duration,
    ) -> Lease {
        Lease {
            store,
            key,
            token,
            fingerprint,
            lease,
            retention,
            observe: None,
        }
    }

    /// The store this lease was claimed in.
    pub(crate) fn store_arc(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Records this lease's work duration with these labels, and shows its
    /// key in logs as they say.
    pub(crate) fn observed(mut self, observe: Observe) -> Lease {
        self.observe = Some(observe);
        self
    }

    /// Counts this lease's claim as a decision to execute, as a claim that
    /// inserted its record does.
    pub(crate) fn decided_to_run(&self) {
        if let Some(observe) = &self.observe {
            observe.decided("executed");
        }
    }

    /// The key as logs show it (a hash by default).
    fn traced_key(&self) -> TracedKey<'_> {
        let keys = self.observe.as_ref().map(|o| o.keys).unwrap_or_default();
        TracedKey(&self.key, keys)
    }

    /// The key this lease holds.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// This owner's fencing token.
    pub fn token(&self) -> Token {
        self.token
    }

    /// The fingerprint of the request this lease runs.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The lease's length: how long a claim or renewal holds the key.
    pub fn lease_length(&self) -> Duration {
        self.lease
    }

    /// How long a recorded outcome is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// How often [`renew`](Lease::renew) should be called while the work
    /// runs: a third of the lease, so two renewals may fail before it lapses
    /// (never below [`clamp::SHORTEST`](crate::store::clamp::SHORTEST)).
    pub fn heartbeat_interval(&self) -> Duration {
        crate::store::clamp::heartbeat(self.lease)
    }

    /// Runs `work` while renewing this lease, both polled in the calling
    /// task, so no spawned task can outlive the call (and a dropped call
    /// stops both). This is the loop [`Idempotent::execute`](crate::Idempotent::execute)
    /// uses; a framework built on [`begin`](crate::Idempotent::begin) calls
    /// it too.
    ///
    /// If a renewal finds the lease lost (it lapsed and another caller took
    /// the key over), the work is still finished — stopping it halfway
    /// could leave its side effect half done — and the result says so:
    /// its outcome must then not be recorded (recording would fail with
    /// [`Error::LeaseLost`] anyway).
    pub async fn run<F: Future>(&self, work: F) -> RunOutput<F::Output> {
        let started = std::time::Instant::now();
        let mut work = pin!(work);
        let heartbeat = self.heartbeat();
        let mut heartbeat = pin!(heartbeat);
        let ran = tokio::select! {
            biased;
            output = &mut work => RunOutput { output, lease_lost: false },
            () = &mut heartbeat => {
                tracing::warn!(key = %self.traced_key(),
                    "lease lost while the work ran; its outcome will not be recorded");
                RunOutput { output: work.await, lease_lost: true }
            }
        };
        if let Some(observe) = &self.observe {
            observe.worked(started.elapsed());
        }
        ran
    }

    /// Extends the lease by its full length from now.
    pub async fn renew(&self) -> Result<(), Error> {
        self.swap(State::InFlight, &[]).await
    }

    /// Records the work's outcome as `Completed`; every retry replays it.
    pub async fn complete(&self, payload: &[u8]) -> Result<(), Error> {
        self.swap(State::Completed, payload).await
    }

    /// Records a failure as `Failed`; every retry replays it.
    pub async fn fail(&self, payload: &[u8]) -> Result<(), Error> {
        self.swap(State::Failed, payload).await
    }

    /// Gives the key back: the next call runs the work again.
    pub async fn release(&self) -> Result<(), Error> {
        match self.store.remove(self.key.as_str(), self.token).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::LeaseLost),
            Err(source) => Err(Error::store(source, When::AfterWork)),
        }
    }

    async fn swap(&self, state: State, payload: &[u8]) -> Result<(), Error> {
        let record = self.record(state, payload);
        match self
            .store
            .swap(self.key.as_str(), self.token, &record)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::LeaseLost),
            Err(source) => Err(Error::store(source, When::AfterWork)),
        }
    }

    /// Renews the lease every [`heartbeat_interval`](Lease::heartbeat_interval)
    /// and returns once a renewal finds the lease lost. A renewal that fails
    /// in the store is logged and tried again at the next beat: the lease
    /// still has two thirds of its length to run.
    pub async fn heartbeat(&self) {
        let every = self.heartbeat_interval();
        loop {
            tokio::time::sleep(every).await;
            match self.renew().await {
                Ok(()) => {}
                Err(Error::LeaseLost) => return,
                Err(error) => {
                    tracing::warn!(key = %self.traced_key(), %error, "lease renewal failed")
                }
            }
        }
    }
}
