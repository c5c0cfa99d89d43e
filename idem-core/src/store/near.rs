//! A near cache: settled records kept in the process, in front of any store.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use metrics::{Key as MetricKey, Label, Level, Metadata, SharedString};
use tokio::time::Instant;

use super::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token, Wakeups};

/// How many records a [`NearCache`] keeps by default.
pub const DEFAULT_NEAR_ENTRIES: usize = 10_000;

/// How many bytes of keys and payloads a [`NearCache`] keeps by default.
pub const DEFAULT_NEAR_BYTES: usize = 16 << 20;

/// How long a [`NearCache`] keeps a record at most by default, whatever
/// retention the store reported.
pub const DEFAULT_NEAR_MAX_AGE: Duration = Duration::from_secs(60);

/// What an entry costs beside its key and payload, for the byte bound.
const ENTRY_OVERHEAD: usize = 96;

/// A store that answers replays from memory: a near cache in front of any
/// [`Store`].
///
/// It keeps **settled** records (`Completed`, and `Failed` when a failure
/// was remembered) that the store returned, from
/// [`insert`](Store::insert)'s [`Insert::Found`] or from
/// [`load`](Store::load), and answers a later `insert` of the same key with
/// the kept record, without a round trip. The state machine then decides on
/// it as it would on the store's answer: a replay, or a mismatch when the
/// request's fingerprint is not the record's. Nothing else is answered from
/// memory: `load` (which reports retention exactly) and every write go to
/// the store.
///
/// # Why it is correct
///
/// * A settled record is final until its retention lapses: no method of
///   the [`Store`] contract replaces or deletes it. So while the store
///   holds it, a kept copy is exactly what the store would return.
/// * An `InFlight` record is never kept: its lease, token and state change.
/// * An entry lives no longer than the retention the store reported,
///   counted from *before* the call was sent (the store measured it later,
///   so the entry ends no later than the record), and no longer than
///   [`with_max_age`](NearCache::with_max_age) (60 s by default), so that a
///   store clock running fast against the process cannot stretch it. Where
///   the store reported a settled record's retention as a lower bound, as
///   the contract allows for `Insert::Found` (Redis reports 1 ms), and it
///   is shorter than the cap, the cache reads the record once more with
///   `load`, which reports it exactly, before keeping it: one more round
///   trip on that miss, none on the hits that follow.
/// * The answer from memory is reported with the retention left on the
///   entry, which is never longer than the time left in the store: the
///   lower bound the contract allows for a settled record found.
///
/// Its correctness does not depend on other processes: each has its own
/// cache, and a record settled through one is kept by another only once
/// that one reads it.
///
/// # What ends a record early
///
/// [`purge_expired`](Store::purge_expired) deletes only records past
/// retention, which no entry outlives. Anything that deletes a *live*
/// settled record (an operator removing a key by hand, in the backend or
/// through a future administrative call) is not seen by the caches of
/// other processes: each may go on replaying it for up to its
/// [`max_age`](NearCache::with_max_age). A call of that kind made through
/// this wrapper drops its own entry. Keep the cap short where records are
/// removed by hand.
///
/// # Why a store wrapper
///
/// A wrapper composes with every store and every caller of the trait
/// ([`Idempotent`](crate::Idempotent), the HTTP exchange, durable steps),
/// keeps `Idempotent` free of caching, and is itself a [`Store`], so the
/// conformance kit runs through it unchanged.
///
/// ```
/// use idem_core::store::NearCache;
/// use idem_core::{Idempotent, MemoryStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let idem = Idempotent::new(NearCache::new(MemoryStore::new()));
/// let first: u32 = idem.execute("order-1", &"body", || async { Ok::<_, ()>(7) }).await.unwrap();
/// let again: u32 = idem.execute("order-1", &"body", || async { Ok::<_, ()>(8) }).await.unwrap();
/// assert_eq!((first, again), (7, 7));
/// # });
/// ```
///
/// # Metrics
///
/// Through the [`metrics`] facade, labelled `store` (the wrapped store's
/// name): `idem_near_cache_hits_total`, `idem_near_cache_misses_total` (an
/// `insert` the cache could not answer), `idem_near_cache_evictions_total`
/// (entries dropped to stay within the bounds) and the gauge
/// `idem_near_cache_bytes`. [`stats`](NearCache::stats) reads the same
/// figures.
pub struct NearCache<S> {
    inner: S,
    shared: Shared,
}

/// What a [`NearCache`] has done since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct NearCacheStats {
    /// `insert`s answered from memory.
    pub hits: u64,
    /// `insert`s that went to the store.
    pub misses: u64,
    /// Entries dropped to stay within the bounds.
    pub evictions: u64,
    /// Entries dropped because their time was up.
    pub expirations: u64,
    /// Entries held now.
    pub entries: usize,
    /// Bytes of keys and payloads held now, with a fixed cost per entry.
    pub bytes: usize,
}

struct Shared {
    map: Mutex<Entries>,
    max_entries: usize,
    max_bytes: usize,
    max_age: Duration,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    expirations: AtomicU64,
    /// How many times an entry was forgotten (a reset, `forget`, `clear`),
    /// changed only under the map's lock. A record read by a call that
    /// began before the last change is not kept: it may be the record a
    /// reset was deleting while the call was in flight.
    forgotten: AtomicU64,
    metrics: MetricKeys,
}

struct MetricKeys {
    hits: MetricKey,
    misses: MetricKey,
    evictions: MetricKey,
    bytes: MetricKey,
}

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

#[derive(Default)]
struct Entries {
    by_key: HashMap<Box<str>, Entry>,
    /// Keys in the order they were kept, with the entry's number: the
    /// oldest goes first. A number that no longer matches its entry's is
    /// skipped.
    order: VecDeque<(Box<str>, u64)>,
    next: u64,
    bytes: usize,
}

struct Entry {
    record: Record,
    until: Instant,
    number: u64,
    size: usize,
}

impl<S: Store> NearCache<S> {
    /// A near cache in front of `store`, with the default bounds
    /// ([`DEFAULT_NEAR_ENTRIES`], [`DEFAULT_NEAR_BYTES`],
    /// [`DEFAULT_NEAR_MAX_AGE`]).
    pub fn new(store: S) -> NearCache<S> {
        let name = crate::observe::store_name(&store);
        NearCache {
            inner: store,
            shared: Shared::new(
                &name,
                DEFAULT_NEAR_ENTRIES,
                DEFAULT_NEAR_BYTES,
                DEFAULT_NEAR_MAX_AGE,
            ),
        }
    }
}

impl<S> NearCache<S> {
    /// Keeps at most `entries` records (at least one).
    pub fn with_max_entries(mut self, entries: usize) -> NearCache<S> {
        self.shared.max_entries = entries.max(1);
        self
    }

    /// Keeps at most `bytes` of keys and payloads, counting a fixed cost
    /// per entry besides. A record larger than this alone is not kept.
    pub fn with_max_bytes(mut self, bytes: usize) -> NearCache<S> {
        self.shared.max_bytes = bytes;
        self
    }

    /// Keeps a record at most `age`, however long the store said it has
    /// left (60 s by default). This is how long another process's removal
    /// of a live record may go unseen here.
    pub fn with_max_age(mut self, age: Duration) -> NearCache<S> {
        self.shared.max_age = age;
        self
    }

    /// The store it wraps.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The counters and the size now.
    pub fn stats(&self) -> NearCacheStats {
        let entries = self.shared.lock();
        NearCacheStats {
            hits: self.shared.hits.load(Ordering::Relaxed),
            misses: self.shared.misses.load(Ordering::Relaxed),
            evictions: self.shared.evictions.load(Ordering::Relaxed),
            expirations: self.shared.expirations.load(Ordering::Relaxed),
            entries: entries.by_key.len(),
            bytes: entries.bytes,
        }
    }

    /// Drops every entry, so that the next `insert` of each key goes to
    /// the store.
    pub fn clear(&self) {
        let mut entries = self.shared.lock();
        self.shared.forgotten.fetch_add(1, Ordering::SeqCst);
        entries.clear();
        self.shared.gauge(0);
    }

    /// Drops the entry of `key`, if any. Whatever deletes a live record of
    /// this store through this wrapper calls it.
    pub fn forget(&self, key: &str) {
        let mut entries = self.shared.lock();
        self.shared.forgotten.fetch_add(1, Ordering::SeqCst);
        if let Some(entry) = entries.by_key.remove(key) {
            entries.bytes -= entry.size;
            self.shared.gauge(entries.bytes);
        }
    }
}

impl Shared {
    fn new(store: &str, max_entries: usize, max_bytes: usize, max_age: Duration) -> Shared {
        let labels = [Label::new("store", SharedString::from(store.to_owned()))];
        let key = |name: &'static str| MetricKey::from_parts(name, labels.to_vec());
        let metrics = MetricKeys {
            hits: key("idem_near_cache_hits_total"),
            misses: key("idem_near_cache_misses_total"),
            evictions: key("idem_near_cache_evictions_total"),
            bytes: key("idem_near_cache_bytes"),
        };
        Shared {
            map: Mutex::new(Entries::default()),
            max_entries,
            max_bytes,
            max_age,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            expirations: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // The map is consistent between statements; a panic elsewhere while
        // it was held leaves nothing half-done.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, counter: &AtomicU64, key: &MetricKey, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(n);
    }

    fn gauge(&self, bytes: usize) {
        metrics::with_recorder(|recorder| recorder.register_gauge(&self.metrics.bytes, &METADATA))
            .set(bytes as f64);
    }

    /// The kept record of `key` with the retention it has left, if its
    /// time is not up.
    fn lookup(&self, key: &str) -> Option<Record> {
        let now = Instant::now();
        let mut entries = self.lock();
        let entry = entries.by_key.get(key)?;
        if entry.until > now {
            let mut record = entry.record.clone();
            record.retention_remaining = entry.until - now;
            drop(entries);
            self.count(&self.hits, &self.metrics.hits, 1);
            return Some(record);
        }
        if let Some(entry) = entries.by_key.remove(key) {
            entries.bytes -= entry.size;
            self.gauge(entries.bytes);
        }
        drop(entries);
        self.expirations.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Where a call to the store begins: the time and how many times an
    /// entry had been forgotten.
    fn ask(&self) -> Asked {
        Asked {
            at: Instant::now(),
            forgotten: self.forgotten.load(Ordering::SeqCst),
        }
    }

    /// Keeps `record`, a settled record the store returned for a call that
    /// began as `asked` says, until its reported retention or the cap runs
    /// out; not if an entry was forgotten since the call began.
    fn keep(&self, key: &str, record: &Record, asked: Asked) {
        if !settled(record) {
            return;
        }
        let until = asked.at + record.retention_remaining.min(self.max_age);
        if until <= Instant::now() {
            return;
        }
        let size = key.len() + record.payload.len() + ENTRY_OVERHEAD;
        if size > self.max_bytes {
            return;
        }
        let mut entries = self.lock();
        if self.forgotten.load(Ordering::SeqCst) != asked.forgotten {
            return;
        }
        let number = entries.next;
        entries.next += 1;
        let entry = Entry {
            record: record.clone(),
            until,
            number,
            size,
        };
        if let Some(old) = entries.by_key.insert(key.into(), entry) {
            entries.bytes -= old.size;
        }
        entries.bytes += size;
        entries.order.push_back((key.into(), number));
        let mut evicted = 0;
        while entries.by_key.len() > self.max_entries || entries.bytes > self.max_bytes {
            let Some((oldest, number)) = entries.order.pop_front() else {
                break;
            };
            if entries
                .by_key
                .get(&oldest)
                .is_some_and(|e| e.number == number)
            {
                if let Some(gone) = entries.by_key.remove(&oldest) {
                    entries.bytes -= gone.size;
                    evicted += 1;
                }
            }
        }
        entries.compact();
        let bytes = entries.bytes;
        drop(entries);
        if evicted > 0 {
            self.count(&self.evictions, &self.metrics.evictions, evicted);
        }
        self.gauge(bytes);
    }
}

impl Entries {
    fn clear(&mut self) {
        self.by_key.clear();
        self.order.clear();
        self.bytes = 0;
    }

    /// Drops the order's stale numbers once they outnumber the entries, so
    /// that replaced and expired entries cannot grow it without bound.
    fn compact(&mut self) {
        if self.order.len() > 2 * self.by_key.len() + 64 {
            let by_key = &self.by_key;
            self.order
                .retain(|(key, number)| by_key.get(key).is_some_and(|e| e.number == *number));
        }
    }
}

#[derive(Clone, Copy)]
struct Asked {
    at: Instant,
    forgotten: u64,
}

fn settled(record: &Record) -> bool {
    matches!(record.state, State::Completed | State::Failed)
}

impl<S: Store> NearCache<S> {
    /// Keeps a settled record `insert` found. A retention shorter than the
    /// cap may be a lower bound: read the record once more to learn it,
    /// and keep it only if it is still the record found.
    async fn keep_found(&self, key: &str, found: &Record, asked: Asked) {
        if !settled(found) {
            return;
        }
        if found.retention_remaining >= self.shared.max_age {
            self.shared.keep(key, found, asked);
            return;
        }
        let again = Asked {
            at: Instant::now(),
            ..asked
        };
        if let Ok(Some(read)) = self.inner.load(key).await {
            if read.token == found.token && read.fingerprint == found.fingerprint {
                self.shared.keep(key, &read, again);
            }
        }
    }
}

#[async_trait]
impl<S: Store> Store for NearCache<S> {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        if let Some(kept) = self.shared.lookup(key) {
            return Ok(Insert::Found(kept));
        }
        self.shared
            .count(&self.shared.misses, &self.shared.metrics.misses, 1);
        let asked = self.shared.ask();
        let answer = self.inner.insert(key, record).await?;
        if let Insert::Found(found) = &answer {
            self.keep_found(key, found, asked).await;
        }
        Ok(answer)
    }

    // Every other method goes to the store. A settled record is never
    // changed by `swap`, `take_over` or `remove` (they touch only `InFlight`
    // records), so none of them can leave an entry stale; `purge_expired`
    // deletes only records past retention, which no entry outlives.

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.swap(key, expected, record).await
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.take_over(key, expected, record).await
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        self.inner.remove(key, expected).await
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let asked = self.shared.ask();
        let record = self.inner.load(key).await?;
        if let Some(read) = &record {
            self.shared.keep(key, read, asked);
        }
        Ok(record)
    }

    // A reset deletes a settled record, the one kind this cache keeps: the
    // entry goes before and after the store's answer, and a read in flight
    // across the reset, which may bring the old record back, is not kept
    // (see `forgotten`). Other processes' caches may answer from the old
    // record until their cap.
    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        self.forget(key);
        let answer = self.inner.reset(key).await;
        self.forget(key);
        answer
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }

    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        self.inner.wakeups()
    }
}

impl<S: fmt::Debug> fmt::Debug for NearCache<S> {
    /// Shows as the store it wraps, so that metrics and traces keep its
    /// name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}
