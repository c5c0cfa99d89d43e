//! For those who write a store or run one: the [`Store`] trait and its
//! atomic primitives, the records it keeps, the wake-ups it sends, the
//! transactional completion a SQL store offers ([`StoreTx`]) and the purger
//! that deletes lapsed records.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

pub mod clamp;
mod near;
mod purger;
mod record;
mod tx;
mod wake;

pub use crate::effects::PreparedClaim;
pub use crate::idempotent::FALLBACK_POLL;
pub use near::{
    NearCache, NearCacheStats, DEFAULT_NEAR_BYTES, DEFAULT_NEAR_ENTRIES, DEFAULT_NEAR_MAX_AGE,
};
pub use purger::{spawn_purger, PURGE_BATCH};
pub use record::{NewRecord, ParseError, Record, State, Token};
pub use tx::{StoreTx, TxFuture, Uncommitted};
pub use wake::{Wakeups, Watch};

/// What [`Store::insert`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Insert {
    /// No live record was there; the new one is now stored.
    Inserted,
    /// A live record was there and is left untouched; here it is.
    Found(Record),
}

/// What [`Store::reset`] found, and whether it deleted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a reset may have been refused: an in-flight record is left alone"]
pub enum Reset {
    /// A live `Completed` or `Failed` record was there (its state here)
    /// and is deleted: the next claim of the key runs the work again.
    Deleted(State),
    /// A live `InFlight` record is there, whatever its lease, and is left
    /// untouched: an owner may be running the work. Releasing it is the
    /// owner's step, fenced by its token ([`Store::remove`]).
    InFlight,
    /// No live record is there (never written, released, reset or past
    /// retention); nothing changed.
    Absent,
}

impl Reset {
    /// The word metrics and log lines use: `deleted`, `in_flight` or
    /// `absent`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Reset::Deleted(_) => "deleted",
            Reset::InFlight => "in_flight",
            Reset::Absent => "absent",
        }
    }
}

/// A store's persistence layer for idempotency records.
///
/// A store keeps one record per key and offers a handful of primitives, each
/// **atomic on a single key**. It holds no policy: fingerprints, states and
/// retries are decided by the state machine in this crate, which is the only
/// caller a store needs to serve. [`MemoryStore`](crate::MemoryStore) is the
/// executable form of this contract, and
/// [`idem-conformance`](https://docs.rs/idem-conformance) checks a store
/// against it.
///
/// # Contract
///
/// *Time.* A store MUST compute every deadline on its own clock from the
/// durations it is given (`lease`, `retention` in [`NewRecord`]) and MUST
/// report times *remaining* on read ([`Record::lease_remaining`],
/// [`Record::retention_remaining`]): the time left now on its clock, in
/// every record it returns ([`load`](Store::load) and [`Insert::Found`]),
/// never the length the record was written with. One exception: the
/// retention of a `Completed` or `Failed` record in [`Insert::Found`] MAY
/// be reported short of the time left, down to the least time above zero
/// (a lower bound), for a store whose claim cannot read a found value's
/// deadline in the same step without a cost on every replay (Redis's
/// `SET … NX GET`); it MUST NOT be reported longer than the time left.
/// No decision rests on it: a settled record found is replayed or refused
/// whatever its retention, and [`load`](Store::load) reports it exactly.
/// The lease of an `InFlight` record found, which decides between waiting
/// and taking over, is always the time left now. Every write that replaces
/// a record (`insert`, `swap`, `take_over`) MUST compute *both* deadlines
/// afresh from now; in particular a renewal (a `swap` that keeps the record
/// `InFlight`) restarts the retention as well as the lease, so heartbeating
/// work never outlives its record. It MUST NOT trust the caller's clock
/// (the trait hands it only durations, so no conformance case can observe
/// this).
///
/// *Liveness.* A record is **live** until its retention deadline passes.
/// A record past retention MUST behave as absent in every method: `insert`
/// replaces it, `load` returns `None`, `swap`, `take_over` and `remove`
/// return `false`. A store MAY delete it lazily. A lease that has lapsed
/// does not make a record absent: the record stays live (and its key
/// blocked) until it is taken over or its retention lapses.
///
/// *Purging.* Records past retention MUST NOT pile up in the backend.
/// [`purge_expired`](Store::purge_expired) MUST delete them, at most
/// `limit` a call, and MUST return exactly how many it deleted. It MUST
/// NOT delete a live record, whatever its state or lease, judging each by
/// the retention of its latest write. A call that returns less than
/// `limit` MUST leave stored none of the records that were past retention
/// when it began, other writers aside: a purger calls again while a call
/// returns `limit`, and stops at the first that returns less. A backend
/// that expires records itself (a Redis key's TTL) meets this without
/// deleting: those records are gone, and the purge counts only its own
/// deletions. Through the trait an expired record looks absent either
/// way, so the conformance kit counts the records stored in the backend.
///
/// *Atomicity.* Each method MUST be one atomic step on one key: two callers
/// racing on the same key MUST see the outcome of some serial order. In
/// particular two concurrent `insert`s of an absent key MUST yield exactly
/// one [`Insert::Inserted`].
///
/// *Fencing.* `swap`, `take_over` and `remove` are compare-and-set on the
/// token. They MUST change a record only when it is live, in state
/// [`InFlight`](crate::store::State::InFlight) and holds exactly the expected
/// token, and MUST otherwise change nothing and return `false`. A
/// `Completed` or `Failed` record is final until its retention lapses: no
/// method replaces or deletes it, not even `take_over`, though it holds no
/// lease (a failure remembered a moment ago has no lease to lapse). The
/// one exception is [`reset`](Store::reset), an operator's step, which
/// deletes a settled record and nothing else.
///
/// *Reset.* `reset` MUST delete the record under a key exactly when it is
/// live and `Completed` or `Failed`, and say so with
/// [`Reset::Deleted`] and the state it deleted. It MUST leave an `InFlight`
/// record untouched, whether its lease is live or lapsed, and answer
/// [`Reset::InFlight`]; and answer [`Reset::Absent`] for a key without a
/// live record (a record past retention included). The check and the
/// delete MUST be one atomic step: of two resets racing on one settled
/// record exactly one deletes it, and a reset never deletes a claim that
/// landed after another reset's delete. A reset MUST delete, never
/// rewrite: no token the record held may change anything afterwards (an
/// owner's late `swap`, `take_over` or `remove` with it returns `false`).
/// A reset that deleted nothing MAY report `InFlight` or `Absent` from a
/// read that follows its delete, as long as the answer is what that read
/// saw and some serial order explains it.
///
/// *Fidelity.* Payloads, tokens and fingerprints MUST round-trip byte for
/// byte, including an empty payload and payloads of several MiB; a
/// fingerprint MUST keep its [scheme](crate::Fingerprint::scheme) (store
/// [`Fingerprint::stored`](crate::Fingerprint::stored), which is today's 32
/// bytes for scheme 1). Keys are
/// strings of up to about 800 bytes of UTF-8 without control characters; a
/// store MUST keep distinct keys distinct.
///
/// *Errors.* A store MUST return [`StoreError`] for a backend failure and
/// for data it cannot decode, and MUST NOT panic on either. After an error
/// the caller cannot know whether the step took effect. (The trait offers
/// no way to break a backend or plant undecodable data, so each store
/// checks these in its own tests, not through the conformance kit.)
///
/// *Cost.* Each method SHOULD be one round trip to the backend; the
/// protocol's costs (two round trips for a first execution, one for a
/// replay) rest on it. An `insert` that finds a record in flight MAY take
/// a second, to read its lease left (Redis's claim does: see
/// `idem-redis`), and a `reset` that deletes nothing MAY take a second, to
/// say what is there (MariaDB's does). (Measured by `idem-bench`, not checked by the kit.)
///
/// *Wake-ups* (optional). A store MAY offer [`wakeups`](Store::wakeups);
/// one that does MUST call [`Wakeups::wake`] for a key after every `swap`
/// to `Completed` or `Failed` and every `remove` of it that took effect,
/// and SHOULD NOT for renewals. A wake-up may be late or lost (waiters
/// still poll), but one sent before the change is visible to `load` and
/// `insert` is a bug: the woken waiter would read the old record.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Inserts `record` under `key` unless a live record is there.
    ///
    /// MUST store `record` (with deadlines `now + lease` and
    /// `now + retention`) and return [`Insert::Inserted`] when the key is
    /// absent or its record is past retention. MUST otherwise leave the
    /// record as it is and return it in [`Insert::Found`] — including an
    /// `InFlight` record whose lease has lapsed.
    ///
    /// `record` is a claim (`InFlight`, with a lease) or, for a chunk of an
    /// outcome too large for one record ([`chunks`](crate::chunks)), a
    /// `Completed` record without a lease, which MUST be stored as it is:
    /// settled from its first write, final until its retention lapses.
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError>;

    /// Replaces the record under `key` with `record` if it is live,
    /// `InFlight` and holds `expected`; returns whether it did.
    ///
    /// This is how an owner completes, fails or renews its lease. Both new
    /// deadlines, lease and retention, MUST be computed from now, for a
    /// renewal too. The lease is deliberately not
    /// checked: an owner whose lease lapsed while nobody took the key over
    /// is still the only one that ran the work, so its outcome is recorded;
    /// once a takeover changed the token, the swap fails.
    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError>;

    /// Replaces the record under `key` with `record` if it is live,
    /// `InFlight`, holds `expected` **and its lease has lapsed**; returns
    /// whether it did. A `Completed` or `Failed` record, which holds no
    /// lease, MUST be left alone.
    ///
    /// This is how a crashed owner's key is recovered. The lease check MUST
    /// be part of the same atomic step: an owner that renews its lease just
    /// before a takeover MUST make the takeover fail.
    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError>;

    /// Deletes the record under `key` if it is live, `InFlight` and holds
    /// `expected`; returns whether it did. This is how an owner releases a
    /// key after work that may be retried.
    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError>;

    /// Reads the live record under `key`, or `None`.
    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError>;

    /// Deletes the record under `key` if it is live and settled
    /// (`Completed` or `Failed`), so that the key runs its work again; an
    /// `InFlight` record is left alone. Says what it found (see
    /// [`Reset`] and the contract's *Reset*).
    ///
    /// This is an operator's step (`idem reset`,
    /// [`Idempotent::reset`](crate::Idempotent::reset)), never part of a
    /// request: the state machine does not call it.
    async fn reset(&self, key: &str) -> Result<Reset, StoreError>;

    /// Deletes up to `limit` records that are past retention and returns
    /// exactly how many it deleted. MUST NOT delete a live record, whatever
    /// its state (`InFlight` with a lapsed lease, `Completed`, `Failed`),
    /// judging each by the retention of its latest write. Less than `limit`
    /// MUST mean that no record already past retention when the call began
    /// is left stored; so call it again while it returns `limit` (see the
    /// contract's *Purging*).
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError>;

    /// The wake-ups this store sends when an outcome is recorded or a claim
    /// released, or `None` (the default) when waiters must poll.
    ///
    /// The one method with a default, on purpose: `None` is never wrong,
    /// only slower — a waiter on such a store polls with backoff, as it
    /// always did — so a store written before wake-ups existed compiles
    /// unchanged and stays correct. A store that needs a listener
    /// connection SHOULD start it on the first call, so a store nobody
    /// waits on holds no extra connection; the first call is made from
    /// within a tokio runtime.
    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        None
    }
}

// A call through this impl boxes one more future than a call on the store
// itself, so the crate's own paths call `(*arc).insert(…)` and the like.
#[async_trait]
impl<S: Store + ?Sized> Store for Arc<S> {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        (**self).insert(key, record).await
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        (**self).swap(key, expected, record).await
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        (**self).take_over(key, expected, record).await
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        (**self).remove(key, expected).await
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        (**self).load(key).await
    }

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        (**self).reset(key).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        (**self).purge_expired(limit).await
    }

    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        (**self).wakeups()
    }
}

/// What kind of failure a [`StoreError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend failed or could not be reached.
    Backend,
    /// The backend answered with data that is not a valid record.
    Corrupt,
    /// The store was configured with something it cannot use.
    Config,
}

/// A store failed. Names the backend and keeps the underlying error as its
/// [`source`](std::error::Error::source).
#[derive(Debug)]
pub struct StoreError {
    backend: &'static str,
    kind: StoreErrorKind,
    source: Box<dyn StdError + Send + Sync>,
}

impl StoreError {
    /// A backend failure: a lost connection, a timeout, a failed statement.
    pub fn backend(
        backend: &'static str,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> StoreError {
        StoreError::new(backend, StoreErrorKind::Backend, source)
    }

    /// Data under a key that is not a valid record.
    pub fn corrupt(
        backend: &'static str,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> StoreError {
        StoreError::new(backend, StoreErrorKind::Corrupt, source)
    }

    /// A store built with an option it cannot use.
    pub fn config(
        backend: &'static str,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> StoreError {
        StoreError::new(backend, StoreErrorKind::Config, source)
    }

    /// Builds an error of any kind.
    pub fn new(
        backend: &'static str,
        kind: StoreErrorKind,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> StoreError {
        StoreError {
            backend,
            kind,
            source: source.into(),
        }
    }

    /// The backend's name, such as `"redis"`.
    pub fn backend_name(&self) -> &'static str {
        self.backend
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            StoreErrorKind::Backend => write!(f, "{} store failed: {}", self.backend, self.source),
            StoreErrorKind::Corrupt => write!(
                f,
                "{} store holds a record that does not decode: {}",
                self.backend, self.source
            ),
            StoreErrorKind::Config => {
                write!(
                    f,
                    "{} store is misconfigured: {}",
                    self.backend, self.source
                )
            }
        }
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}
