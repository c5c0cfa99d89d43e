//! The begin/complete API for frameworks: a claimed key is a [`Lease`], a
//! recorded one is a [`Replay`].

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::observe::{KeyInTraces, Observe, TracedKey};
use crate::store::{NewRecord, State, Store, Token};
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

    /// Runs `work` while renewing this lease. This is the loop
    /// [`Idempotent::execute`](crate::Idempotent::execute) uses; a framework
    /// built on [`begin`](crate::Idempotent::begin) calls it too.
    ///
    /// The renewals run in a task of their own, so work that blocks its
    /// thread (a synchronous client, a long computation) keeps its lease on
    /// a multi-thread runtime: another worker renews it. On a
    /// current-thread runtime, or one whose every worker is blocked, nothing
    /// else runs while the work blocks, the heartbeat and the store's I/O
    /// included: the lease lapses after its length and the fencing keeps
    /// the outcome from being recorded. Blocking work belongs in
    /// [`spawn_blocking`](tokio::task::spawn_blocking) there.
    ///
    /// The heartbeat stops when the work finishes (a renewal in flight is
    /// let finish first, so that none can land after the outcome is
    /// recorded) and is aborted at once when this future is dropped: the
    /// key then stays claimed until the lease lapses.
    ///
    /// If a renewal finds the lease lost (it lapsed and another caller took
    /// the key over), the work is still finished — stopping it halfway
    /// could leave its side effect half done — and the result says so:
    /// its outcome must then not be recorded (recording would fail with
    /// [`Error::LeaseLost`] anyway).
    ///
    /// # Panics
    /// Outside a tokio runtime, and with the panic of a store whose
    /// renewal panicked (once the work has finished).
    pub async fn run<F: Future>(&self, work: F) -> RunOutput<F::Output> {
        let started = std::time::Instant::now();
        let heartbeat = Heartbeat::start(self).await;
        let output = work.await;
        let lease_lost = heartbeat.stop().await;
        if let Some(observe) = &self.observe {
            observe.worked(started.elapsed());
        }
        RunOutput { output, lease_lost }
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
        match (*self.store).remove(self.key.as_str(), self.token).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::LeaseLost),
            Err(source) => Err(Error::store(source, When::AfterWork)),
        }
    }

    async fn swap(&self, state: State, payload: &[u8]) -> Result<(), Error> {
        self.swap_record(&self.record(state, payload)).await
    }

    /// Writes `record` over this lease's, fenced by its token.
    pub(crate) async fn swap_record(&self, record: &NewRecord<'_>) -> Result<(), Error> {
        match (*self.store)
            .swap(self.key.as_str(), self.token, record)
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
        Renewal::of(self).until(std::future::pending()).await;
    }
}

impl Lease {
    /// Renews the lease in a task of its own until it is settled: for work
    /// that runs outside Rust (a Python or Node function), which
    /// [`run`](Lease::run) cannot await. It is `run` around a future that
    /// ends when the [`HeldLease`] is settled or dropped.
    ///
    /// A dropped `HeldLease` stops renewing: the key stays claimed until
    /// the lease lapses, as when a `run` future is dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn hold(self) -> HeldLease {
        let (done, finished) = oneshot::channel::<()>();
        let renewed = self.clone();
        let heartbeat = tokio::spawn(async move {
            let work = async {
                let _ = finished.await;
            };
            renewed.run(work).await.lease_lost
        });
        HeldLease {
            lease: self,
            done,
            heartbeat,
        }
    }
}

/// A lease renewed while its work runs elsewhere ([`Lease::hold`]); each
/// way of settling it stops the renewal first, and fails with
/// [`Error::LeaseLost`] when a renewal found the lease lost meanwhile.
pub struct HeldLease {
    lease: Lease,
    done: oneshot::Sender<()>,
    heartbeat: JoinHandle<bool>,
}

impl fmt::Debug for HeldLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLease")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl HeldLease {
    /// The lease.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Stops the renewal once one in flight is answered, so that none can
    /// land after the outcome; the lease, unless it was lost.
    async fn stop(self) -> Result<Lease, Error> {
        let _ = self.done.send(());
        match self.heartbeat.await {
            Ok(true) => Err(Error::LeaseLost),
            _ => Ok(self.lease),
        }
    }

    /// Records the work's outcome as `Completed` ([`Lease::complete`]).
    pub async fn complete(self, payload: &[u8]) -> Result<(), Error> {
        self.stop().await?.complete(payload).await
    }

    /// Records a failure as `Failed` ([`Lease::fail`]).
    pub async fn fail(self, payload: &[u8]) -> Result<(), Error> {
        self.stop().await?.fail(payload).await
    }

    /// Gives the key back ([`Lease::release`]).
    pub async fn release(self) -> Result<(), Error> {
        self.stop().await?.release().await
    }

    /// Stops renewing, once a renewal in flight is answered, and settles
    /// nothing: the key stays claimed until the lease lapses (work whose
    /// end is unknown, such as a cancelled call).
    pub async fn abandon(self) {
        let _ = self.stop().await;
    }
}

/// What the heartbeat needs of a [`Lease`], owned, so that it runs in a
/// task of its own without holding the lease itself.
struct Renewal {
    store: Arc<dyn Store>,
    key: Key,
    record: NewRecord<'static>,
    every: Duration,
    keys: KeyInTraces,
}

impl Renewal {
    fn of(lease: &Lease) -> Renewal {
        Renewal {
            store: Arc::clone(&lease.store),
            key: lease.key.clone(),
            record: lease.record(State::InFlight, &[]),
            every: lease.heartbeat_interval(),
            keys: lease.observe.as_ref().map(|o| o.keys).unwrap_or_default(),
        }
    }

    /// The key as logs show it (a hash by default).
    fn traced_key(&self) -> TracedKey<'_> {
        TracedKey(&self.key, self.keys)
    }

    /// Renews every beat until `stop` resolves (`false`) or a renewal finds
    /// the lease lost (`true`). `stop` is only heeded between renewals: one
    /// in flight is let finish.
    async fn until(&self, stop: impl Future<Output = ()>) -> bool {
        let mut stop = pin!(stop);
        loop {
            tokio::select! {
                biased;
                () = &mut stop => return false,
                () = tokio::time::sleep(self.every) => {}
            }
            match self
                .store
                .swap(self.key.as_str(), self.record.token, &self.record)
                .await
            {
                Ok(true) => {}
                Ok(false) => return true,
                Err(source) => {
                    let error: Error = Error::store(source, When::AfterWork);
                    tracing::warn!(key = %self.traced_key(), %error,
                        "lease renewal failed");
                }
            }
        }
    }
}

/// The heartbeat of one [`Lease::run`], in a task of its own. Dropping it
/// aborts the task, so a dropped `run` stops renewing at once.
struct Heartbeat {
    task: JoinHandle<bool>,
    stop: Option<oneshot::Sender<()>>,
}

impl Heartbeat {
    /// Spawns the heartbeat and returns once it has started.
    async fn start(lease: &Lease) -> Heartbeat {
        let renewal = Renewal::of(lease);
        let (started_tx, started) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            async move {
                let _ = started_tx.send(());
                let lost = renewal
                    .until(async {
                        // A dropped sender stops it too: `run` was dropped.
                        let _ = stopped.await;
                    })
                    .await;
                if lost {
                    tracing::warn!(key = %renewal.traced_key(),
                        "lease lost while the work ran; its outcome will not be recorded");
                }
                lost
            }
            .in_current_span(),
        );
        let heartbeat = Heartbeat {
            task,
            stop: Some(stop),
        };
        // Spawned from a worker, the task waits in that worker's next-task
        // slot, which no other worker may steal: work that blocked at once
        // would keep it from ever starting. Once polled it waits on its
        // timer, which any worker fires.
        let _ = started.await;
        heartbeat
    }

    /// Stops the heartbeat once any renewal in flight is answered; whether
    /// a renewal found the lease lost.
    async fn stop(mut self) -> bool {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(lost) => lost,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // Cancelled: the runtime is shutting down. Whether the lease
            // is still held, the fenced recording finds out.
            Err(_) => false,
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}
