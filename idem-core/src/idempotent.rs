//! `Idempotent`: the handle applications call.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use tokio::time::Instant;
use tracing::Instrument;

use crate::fingerprint::MatchingFingerprints;
use crate::machine::{decide, Decision};
use crate::observe::{self, KeyInTraces, Observe, ObservedStore};
use crate::store::{Insert, NewRecord, State, Store, Token, Watch};
use crate::{Begin, Error, Fingerprint, Key, Lease, Replay, When};

/// The default lease: how long a crashed owner blocks its key.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// The default retention: how long outcomes are kept and replayed.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

// A takeover that loses a race looks again at once; each loss means
// another caller changed the record, so a few rounds settle it. Past this
// many losses in a row the caller backs off like a waiter (or gets
// `InProgress` when it does not wait).
const MAX_LOST_TAKEOVERS: usize = 8;

// A waiter polls the store with a backoff doubling from the first to the
// longest pause, never past its deadline or the owner's lease.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(250);

/// How often a waiter woken by its store still reads the record, at the
/// least: the poll then only catches a lost notification, so it is slow.
pub const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// Runs work at most once per idempotency key and replays its outcome.
///
/// Cheap to clone and share: it holds an `Arc` of the store and its
/// settings. See the [crate docs](crate) for the lifecycle.
#[derive(Debug, Clone)]
pub struct Idempotent {
    store: Arc<dyn Store>,
    // The store as this handle calls it: timed, traced and counted.
    observed: Arc<ObservedStore>,
    namespace: Arc<str>,
    scope: Arc<str>,
    lease: Duration,
    retention: Duration,
    wait: Option<Duration>,
    polling: (Duration, Duration),
}

impl Idempotent {
    /// Wraps a store, with a 60 s lease, a 24 h retention, no namespace and
    /// no scope. Accepts an `Arc<dyn Store>` as well as a store by value.
    pub fn new<S: Store>(store: S) -> Idempotent {
        Idempotent::from_arc(Arc::new(store))
    }

    /// Wraps a shared store without adding another `Arc`.
    pub fn from_arc(store: Arc<dyn Store>) -> Idempotent {
        let observe = Observe::new(
            observe::store_name(&*store),
            Arc::from(""),
            KeyInTraces::default(),
        );
        Idempotent {
            observed: Arc::new(ObservedStore::new(Arc::clone(&store), observe)),
            store,
            namespace: Arc::from(""),
            scope: Arc::from(""),
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            wait: None,
            polling: (FIRST_PAUSE, LONGEST_PAUSE),
        }
    }

    /// Sets the lease: how long a claimed key stays blocked without a
    /// heartbeat. The heartbeat renews it every third of this while work
    /// runs, so it only bounds how long a *crashed* owner blocks the key.
    /// Zero is raised to one millisecond.
    pub fn with_lease(mut self, lease: Duration) -> Idempotent {
        self.lease = crate::store::clamp::lease(lease);
        self
    }

    /// Sets the retention: how long a recorded outcome is replayed. A
    /// retention shorter than the lease is raised to the lease for claimed
    /// keys, so that a live lease is never forgotten.
    pub fn with_retention(mut self, retention: Duration) -> Idempotent {
        self.retention = retention.max(crate::store::clamp::SHORTEST);
        self
    }

    /// Sets the namespace that separates applications sharing one store.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Idempotent {
        self.namespace = Arc::from(namespace.into());
        let observe = &self.observed.observe;
        let observe = Observe::new(
            Arc::from(observe.store_name()),
            Arc::clone(&self.namespace),
            observe.keys,
        );
        self.observe(observe)
    }

    /// Sets the `store` label of this handle's metrics and spans (see
    /// [Metrics](crate::observe#metrics)). By default it is the store's type
    /// name without `Store`, in lower case: `sqlite`, `redis`, `postgres`,
    /// `mysql`, `memory`.
    pub fn with_store_name(self, name: impl Into<String>) -> Idempotent {
        let keys = self.observed.observe.keys;
        let namespace = Arc::clone(&self.namespace);
        self.observe(Observe::new(Arc::from(name.into()), namespace, keys))
    }

    /// Sets how keys appear in spans and log lines: a hash by default
    /// (see [`KeyInTraces`]).
    pub fn with_key_in_traces(self, keys: KeyInTraces) -> Idempotent {
        let store = Arc::from(self.observed.observe.store_name());
        let namespace = Arc::clone(&self.namespace);
        self.observe(Observe::new(store, namespace, keys))
    }

    fn observe(mut self, observe: Observe) -> Idempotent {
        self.observed = Arc::new(ObservedStore::new(Arc::clone(&self.store), observe));
        self
    }

    /// Makes a caller that finds the key in progress wait up to `wait` for
    /// the outcome instead of returning [`Error::InProgress`] at once.
    ///
    /// The waiter is bounded by its own deadline and nothing else: it
    /// gets the outcome as soon as one is recorded, takes the key over
    /// (and runs the work) if the owner crashed and its lease lapsed, or
    /// gets [`Error::InProgress`] once `wait` has passed. Durable steps
    /// ([`Durable::execute`](crate::Durable::execute)) wait the same way,
    /// and a takeover resumes after the last recorded step.
    ///
    /// On a store that sends [wake-ups](Store::wakeups) (memory, SQLite,
    /// PostgreSQL, Redis) the waiter watches the key, reads the record
    /// once more (so an outcome recorded meanwhile is not missed) and
    /// sleeps until it is woken, reading the record again only every
    /// [`FALLBACK_POLL`] (or the longest pause of
    /// [`with_wait_polling`](Idempotent::with_wait_polling), if longer) in
    /// case a notification was lost. While the store's notifications do
    /// not flow, and on every other store, it polls with a backoff that
    /// doubles from 5 ms to 250 ms.
    pub fn with_wait(mut self, wait: Duration) -> Idempotent {
        self.wait = Some(wait);
        self
    }

    /// Sets the polling backoff of a waiter: the first pause, doubled up
    /// to `longest` (5 ms and 250 ms by default). Zero pauses are raised
    /// to one millisecond and `first` is capped at `longest`.
    pub fn with_wait_polling(mut self, first: Duration, longest: Duration) -> Idempotent {
        let longest = longest.max(crate::store::clamp::SHORTEST);
        self.polling = (first.clamp(crate::store::clamp::SHORTEST, longest), longest);
        self
    }

    /// The same settings within a tenant's or principal's scope: the same
    /// client key in two scopes names two different records.
    pub fn scoped(&self, scope: impl Into<String>) -> Idempotent {
        Idempotent {
            scope: Arc::from(scope.into()),
            ..self.clone()
        }
    }

    /// The scope this handle's keys are in: the tenant or principal, `""`
    /// when none was set.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The store as this handle calls it: timed, traced and counted.
    pub(crate) fn observed_store(&self) -> &ObservedStore {
        &self.observed
    }

    /// The store behind this handle.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The namespace this handle's keys are in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The `store` label of this handle's metrics and spans (see
    /// [`with_store_name`](Idempotent::with_store_name)).
    pub fn store_name(&self) -> &str {
        self.observed.observe.store_name()
    }

    /// The lease length.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The retention length.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The full key for a client key in this handle's namespace and scope.
    pub fn key(&self, client_key: &str) -> Result<Key, Error> {
        Ok(Key::new(&self.namespace, &self.scope, client_key)?)
    }

    /// Runs `work` once for `key` and `body`, records its outcome, and
    /// replays that outcome to every retry with the same key and body.
    ///
    /// * `Ok(value)` is recorded and returned; retries get an equal value
    ///   without running `work`.
    /// * `Err(e)` releases the key (a retry runs `work` again) and returns
    ///   [`Error::Work`]. To record chosen errors instead, use
    ///   [`execute_remembering`](Idempotent::execute_remembering).
    /// * The same key with another body is [`Error::Mismatch`]; a key held by
    ///   a running call is [`Error::InProgress`].
    ///
    /// While `work` runs, its lease is renewed from a task of its own, so
    /// work that blocks its thread keeps it on a multi-thread runtime (see
    /// [`Lease::run`]). If the future is dropped, or `work` panics, the key
    /// stays claimed until its lease lapses and then one retry takes it
    /// over.
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
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        self.call(
            key,
            body,
            work,
            |_| None,
            |payload| match serde_json::from_slice(payload) {
                Ok(value) => Error::Remembered(value),
                Err(e) => Error::Decode(e),
            },
        )
        .await
    }

    /// Like [`execute`](Idempotent::execute), but an error for which
    /// `remember` returns `true` is recorded as `Failed` and replayed to
    /// every retry as [`Error::Work`] instead of releasing the key. Use it
    /// for final answers such as "card declined".
    pub async fn execute_remembering<B, T, E, R, F, Fut>(
        &self,
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
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        self.call(
            key,
            body,
            work,
            |error| remember(error).then(|| serde_json::to_vec(error)),
            |payload| match serde_json::from_slice(payload) {
                Ok(error) => Error::Work(error),
                Err(e) => Error::Decode(e),
            },
        )
        .await
    }

    async fn call<B, T, E, F, Fut>(
        &self,
        key: &str,
        body: &B,
        work: F,
        remember: impl FnOnce(&E) -> Option<serde_json::Result<Vec<u8>>> + Send,
        replay_failure: impl FnOnce(&[u8]) -> Error<E> + Send,
    ) -> Result<T, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Send,
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        // The key is checked before the body is even encoded: an invalid key
        // touches nothing.
        let key = self.key(key).map_err(Error::into_work_error)?;
        let span = self.observed.observe.span("idem.execute", &key);
        self.call_key(key, body, work, remember, replay_failure)
            .instrument(span)
            .await
    }

    async fn call_key<B, T, E, F, Fut>(
        &self,
        key: Key,
        body: &B,
        work: F,
        remember: impl FnOnce(&E) -> Option<serde_json::Result<Vec<u8>>> + Send,
        replay_failure: impl FnOnce(&[u8]) -> Error<E> + Send,
    ) -> Result<T, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: Serialize + DeserializeOwned + Send,
        E: Send,
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let fingerprint = Fingerprint::of_json(body).map_err(Error::Encode)?;
        let lease = match self.begin_key(key, fingerprint.into()).await {
            Ok(Begin::Run(lease)) => lease,
            Ok(Begin::Replay(replay)) if replay.is_failure() => {
                return Err(replay_failure(replay.payload()))
            }
            Ok(Begin::Replay(replay)) => {
                return serde_json::from_slice(replay.payload()).map_err(Error::Decode)
            }
            Err(error) => return Err(error.into_work_error()),
        };

        let crate::RunOutput {
            output: outcome,
            lease_lost,
        } = lease.run(work()).await;
        if lease_lost {
            return match outcome {
                Err(error) => Err(Error::Work(error)),
                Ok(_) => Err(Error::LeaseLost),
            };
        }
        match outcome {
            Ok(value) => {
                // An outcome that cannot be encoded leaves the key claimed:
                // the work ran, so releasing it would invite a second run.
                let payload = serde_json::to_vec(&value).map_err(Error::Encode)?;
                lease
                    .complete(&payload)
                    .await
                    .map_err(Error::into_work_error)?;
                Ok(value)
            }
            Err(error) => {
                let settled = match remember(&error) {
                    Some(Ok(payload)) => lease.fail(&payload).await,
                    Some(Err(encode)) => {
                        tracing::warn!(error = %encode,
                            "a failure to remember cannot be encoded; releasing the key");
                        lease.release().await
                    }
                    None => lease.release().await,
                };
                if let Err(settle) = settled {
                    // The work's own error is what the caller must see; the
                    // key stays claimed until its lease lapses.
                    tracing::warn!(error = %settle,
                        "could not settle the key after the work failed");
                }
                Err(Error::Work(error))
            }
        }
    }

    /// Claims `key` for a request with this fingerprint, or finds its
    /// recorded outcome. The lower-level API that frameworks (the HTTP
    /// layer) are built on; [`execute`](Idempotent::execute) is this plus
    /// running the work with [`Lease::run`] and the recording.
    ///
    /// `fingerprint` is a [`Fingerprint`], or a [`MatchingFingerprints`] that also
    /// matches records made under older schemes (see
    /// [Schemes](Fingerprint#schemes)); a new record gets the current one.
    ///
    /// Costs one store round trip (on Redis, two when the key is found in
    /// flight), and one more to take over a key whose owner's lease lapsed.
    pub async fn begin(
        &self,
        key: &str,
        fingerprint: impl Into<MatchingFingerprints>,
    ) -> Result<Begin, Error> {
        let key = self.key(key)?;
        let span = self.observed.observe.span("idem.begin", &key);
        self.begin_key(key, fingerprint.into())
            .instrument(span)
            .await
    }

    pub(crate) async fn begin_key(
        &self,
        key: Key,
        fingerprints: MatchingFingerprints,
    ) -> Result<Begin, Error> {
        let fingerprint = fingerprints.current();
        let mut waiter = self.waiter();
        let mut lost_takeovers = 0;
        loop {
            let token = Token::random();
            let record = NewRecord {
                token,
                fingerprint,
                state: State::InFlight,
                payload: &[],
                lease: Some(self.lease),
                retention: self.claimed_retention(),
            };
            let found = match self.observed.claim(key.as_str(), &record).await {
                Ok(Insert::Inserted) => {
                    self.observed.observe.decided("executed");
                    return Ok(Begin::Run(self.lease_for(key, token, fingerprint)));
                }
                Ok(Insert::Found(found)) => found,
                Err(source) => return Err(Error::store(source, When::BeforeWork)),
            };
            let left = match decide(&found, &fingerprints) {
                Decision::Mismatch => {
                    self.observed.observe.decided("mismatch");
                    return Err(Error::Mismatch);
                }
                Decision::Replay => {
                    self.observed.observe.decided("replayed");
                    return Ok(Begin::Replay(Replay::new(found.state, found.payload)));
                }
                Decision::TakeOver(old) => {
                    match (*self.observed).take_over(key.as_str(), old, &record).await {
                        Ok(true) => {
                            self.observed.observe.decided("executed");
                            crate::observe::record_on_current("decision", "taken_over");
                            return Ok(Begin::Run(self.lease_for(key, token, fingerprint)));
                        }
                        // Another recoverer won, or the owner renewed or
                        // finished just in time: look again.
                        Ok(false) if lost_takeovers < MAX_LOST_TAKEOVERS => {
                            lost_takeovers += 1;
                            continue;
                        }
                        Ok(false) => self.lease,
                        Err(source) => return Err(Error::store(source, When::BeforeWork)),
                    }
                }
                Decision::InProgress(left) => left,
            };
            if !waiter.wait(&*self.store, key.as_str(), left).await {
                self.observed.observe.decided("in_progress");
                return Err(Error::InProgress { retry_after: left });
            }
        }
    }

    /// A waiter with this handle's wait and polling, for one call.
    pub(crate) fn waiter(&self) -> Waiter {
        Waiter::new(self.wait, self.polling)
    }

    /// The retention a claimed key is written with.
    fn claimed_retention(&self) -> Duration {
        crate::store::clamp::retention(self.retention, self.lease)
    }

    pub(crate) fn lease_for(&self, key: Key, token: Token, fingerprint: Fingerprint) -> Lease {
        Lease::new(
            Arc::clone(&self.observed) as Arc<dyn Store>,
            key,
            token,
            fingerprint,
            self.lease,
            self.claimed_retention(),
        )
        .observed(self.observed.observe.clone())
    }
}

/// A caller that waits for a key in progress: until its own deadline, with
/// capped backoff, woken early by its store where the store can. `begin`
/// and durable steps share it, so a waiting handle waits alike for both.
pub(crate) struct Waiter {
    deadline: Option<Instant>,
    pause: Duration,
    longest: Duration,
    watch: Option<Watch>,
}

impl Waiter {
    fn new(wait: Option<Duration>, (first, longest): (Duration, Duration)) -> Waiter {
        Waiter {
            // A wait too long to add to the clock waits as long as it can.
            deadline: wait.map(|wait| {
                let now = Instant::now();
                now.checked_add(wait)
                    .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
            }),
            pause: first,
            longest,
            watch: None,
        }
    }

    /// Called each time `key` is found in progress with `left` of its
    /// lease: waits before the caller reads the record again and returns
    /// `true`, or returns `false` at once when the caller should answer
    /// [`Error::InProgress`] (it does not wait, or its deadline passed).
    pub(crate) async fn wait(&mut self, store: &dyn Store, key: &str, left: Duration) -> bool {
        if !self.waits() {
            return false;
        }
        if self.watch.is_none() {
            if let Some(wakeups) = store.wakeups() {
                // Watch first, then read again: an outcome recorded between
                // the last read and the watch is seen by the read, one
                // recorded after it wakes the watch.
                self.watch = Some(wakeups.watch(key));
                return true;
            }
        }
        self.pause(left).await
    }

    /// Whether the caller waits and its deadline is still ahead.
    fn waits(&self) -> bool {
        self.deadline
            .is_some_and(|deadline| Instant::now() < deadline)
    }

    /// Sleeps before the next look at the key, at most until the deadline
    /// and until the owner's lease (`left`) could lapse, and no longer than
    /// a wake-up of the watch; `false` once the deadline has passed (or for
    /// a caller that does not wait).
    async fn pause(&mut self, left: Duration) -> bool {
        let Some(deadline) = self.deadline else {
            return false;
        };
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let woken_by_store = self.watch.as_ref().is_some_and(Watch::is_connected);
        let pace = if woken_by_store {
            self.longest.max(FALLBACK_POLL)
        } else {
            let pace = self.pause;
            self.pause = (self.pause * 2).min(self.longest);
            pace
        };
        // A lapsed lease may read as zero left: pause at least a moment so
        // a takeover that keeps losing does not spin.
        let pause = pace
            .min(left.max(crate::store::clamp::SHORTEST))
            .min(deadline - now);
        match &mut self.watch {
            Some(watch) => {
                tokio::select! {
                    () = watch.woken() => {}
                    () = tokio::time::sleep(pause) => {}
                }
            }
            None => tokio::time::sleep(pause).await,
        }
        true
    }
}
