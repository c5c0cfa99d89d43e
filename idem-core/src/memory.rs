//! `MemoryStore`: the reference store and the executable form of the
//! [`Store`] contract.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token, Wakeups};
use crate::Fingerprint;

/// An in-process store: a map behind a mutex, on tokio's clock.
///
/// It is the reference for the [`Store`] contract, the store for tests and
/// single-process programs, and fast (no I/O). Records vanish with the
/// process. Because it reads time from [`tokio::time::Instant`], tests can
/// pause and advance the clock to lapse leases and retention without
/// sleeping. Waiters are woken in process the moment an outcome is
/// recorded or a claim released ([`Store::wakeups`]).
///
/// [`purge_expired`](Store::purge_expired) takes the records whose
/// retention ended first from an index ordered by deadline, so a purge
/// holds the store's lock for the records it deletes, not for a scan of
/// every record held.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    wakeups: Arc<Wakeups>,
}

#[derive(Debug, Default)]
struct Inner {
    records: HashMap<Arc<str>, Entry>,
    /// Retention deadlines, soonest first. Every record has an item here
    /// due no later than its own retention ends; other items are left over
    /// from records since replaced or removed. An item that comes up finds
    /// its key's record expired (and purges it), live (and is put back at
    /// that record's deadline), or gone (and is dropped).
    deadlines: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
}

impl Inner {
    /// Stores `entry` under `key`, keeping the deadline index's rule:
    /// every record has an item due no later than its retention ends. The
    /// item that served the record it replaces still serves unless the new
    /// deadline is earlier (a completion or a renewal only moves the
    /// deadline on), so most writes leave the index as it is.
    fn put(&mut self, key: &str, entry: Entry) {
        let Some((held, old)) = self.records.get_key_value(key) else {
            let key: Arc<str> = Arc::from(key);
            self.deadlines
                .push(Reverse((entry.retention_deadline, Arc::clone(&key))));
            self.records.insert(key, entry);
            return;
        };
        if entry.retention_deadline < old.retention_deadline {
            self.deadlines
                .push(Reverse((entry.retention_deadline, Arc::clone(held))));
        }
        if let Some(old) = self.records.get_mut(key) {
            *old = entry;
        }
    }

    /// Deletes up to `limit` records whose retention ended by `now`,
    /// soonest first.
    fn purge(&mut self, now: Instant, limit: usize) -> usize {
        let mut purged = 0;
        while purged < limit {
            if self
                .deadlines
                .peek()
                .is_none_or(|Reverse((due, _))| *due > now)
            {
                break;
            }
            let Some(Reverse((_, key))) = self.deadlines.pop() else {
                break;
            };
            let Some(entry) = self.records.get(&key) else {
                continue; // removed since
            };
            if entry.is_live(now) {
                // Its retention was moved on since the item was pushed.
                self.deadlines
                    .push(Reverse((entry.retention_deadline, key)));
            } else {
                self.records.remove(&key);
                purged += 1;
            }
        }
        purged
    }
}

#[derive(Debug)]
struct Entry {
    token: Token,
    fingerprint: Fingerprint,
    state: State,
    payload: Vec<u8>,
    lease_deadline: Option<Instant>,
    retention_deadline: Instant,
}

impl Entry {
    fn new(record: &NewRecord<'_>, now: Instant) -> Entry {
        Entry {
            token: record.token,
            fingerprint: record.fingerprint,
            state: record.state,
            payload: record.payload.to_vec(),
            lease_deadline: record.lease.map(|lease| deadline(now, lease)),
            retention_deadline: deadline(now, record.retention),
        }
    }

    fn is_live(&self, now: Instant) -> bool {
        now < self.retention_deadline
    }

    fn lease_lapsed(&self, now: Instant) -> bool {
        self.lease_deadline.is_none_or(|at| now >= at)
    }

    fn to_record(&self, now: Instant) -> Record {
        Record {
            token: self.token,
            fingerprint: self.fingerprint,
            state: self.state,
            payload: self.payload.clone(),
            lease_remaining: self
                .lease_deadline
                .map(|at| at.saturating_duration_since(now)),
            retention_remaining: self.retention_deadline.saturating_duration_since(now),
        }
    }
}

// A duration too long to add (say `Duration::MAX`) means "as long as the
// clock can count", not a panic.
fn deadline(now: Instant, after: Duration) -> Instant {
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// How many records it holds, live or not yet purged.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether it holds no record at all.
    pub fn is_empty(&self) -> bool {
        self.lock().records.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while the lock was held cannot leave an entry half-written
        // (every change is a single insert or remove; an index push that
        // did not happen only leaves an item missing for a record, which
        // the record's own earlier item or its replacement covers), so a
        // poisoned store is still consistent.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies `record` if the live entry under `key` is `InFlight`, holds
    /// `expected` and passes `also`.
    fn replace_if(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
        also: impl Fn(&Entry, Instant) -> bool,
    ) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        match inner.records.get(key) {
            Some(entry)
                if entry.is_live(now)
                    && entry.state == State::InFlight
                    && entry.token == expected
                    && also(entry, now) =>
            {
                inner.put(key, Entry::new(record, now));
                true
            }
            _ => false,
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        match inner.records.get(key) {
            Some(entry) if entry.is_live(now) => Ok(Insert::Found(entry.to_record(now))),
            _ => {
                inner.put(key, Entry::new(record, now));
                Ok(Insert::Inserted)
            }
        }
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let swapped = self.replace_if(key, expected, record, |_, _| true);
        if swapped && record.state != State::InFlight {
            self.wakeups.wake(key);
        }
        Ok(swapped)
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        Ok(self.replace_if(key, expected, record, Entry::lease_lapsed))
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        match inner.records.get(key) {
            Some(entry)
                if entry.is_live(now)
                    && entry.state == State::InFlight
                    && entry.token == expected =>
            {
                // Its index item is left to be dropped when it comes up.
                inner.records.remove(key);
                drop(inner);
                self.wakeups.wake(key);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let now = Instant::now();
        let inner = self.lock();
        Ok(inner
            .records
            .get(key)
            .filter(|entry| entry.is_live(now))
            .map(|entry| entry.to_record(now)))
    }

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        match inner.records.get(key) {
            Some(entry) if !entry.is_live(now) => Ok(Reset::Absent),
            None => Ok(Reset::Absent),
            Some(entry) if entry.state == State::InFlight => Ok(Reset::InFlight),
            Some(entry) => {
                let state = entry.state;
                // Nobody waits on a settled record, so nobody is woken; its
                // index item is dropped when it comes up.
                inner.records.remove(key);
                Ok(Reset::Deleted(state))
            }
        }
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        Ok(self.lock().purge(Instant::now(), limit))
    }

    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        Some(Arc::clone(&self.wakeups))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn record(state: State, token: Token, retention_ms: u64) -> NewRecord<'static> {
        let retention = Duration::from_millis(retention_ms);
        NewRecord {
            token,
            fingerprint: Fingerprint::of_bytes(b"request"),
            state,
            payload: b"",
            lease: (state == State::InFlight).then_some(retention),
            retention,
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime")
    }

    /// Every record has an item of the index due no later than its
    /// retention ends.
    fn assert_indexed(store: &MemoryStore) {
        let inner = store.lock();
        for (key, entry) in &inner.records {
            let covered = inner
                .deadlines
                .iter()
                .any(|Reverse((due, k))| k == key && *due <= entry.retention_deadline);
            assert!(covered, "{key} has no index item due by its deadline");
        }
    }

    #[test]
    fn renewals_and_completions_leave_the_index_as_it_is() {
        runtime().block_on(async {
            let store = MemoryStore::new();
            let token = Token::random();
            let first = record(State::InFlight, token, 1_000);
            assert_eq!(store.insert("k", &first).await.unwrap(), Insert::Inserted);
            for _ in 0..1_000 {
                tokio::time::advance(Duration::from_millis(10)).await;
                let renewal = record(State::InFlight, token, 1_000);
                assert!(store.swap("k", token, &renewal).await.unwrap());
            }
            let done = record(State::Completed, token, 60_000);
            assert!(store.swap("k", token, &done).await.unwrap());
            assert_eq!(store.lock().deadlines.len(), 1, "the index grew");
            // The first item comes up long before the record's retention
            // ends: the purge moves it on and deletes nothing.
            tokio::time::advance(Duration::from_secs(30)).await;
            assert_eq!(store.purge_expired(10).await.unwrap(), 0);
            assert!(store.load("k").await.unwrap().is_some());
            assert_indexed(&store);
            tokio::time::advance(Duration::from_secs(31)).await;
            assert_eq!(store.purge_expired(10).await.unwrap(), 1);
            assert!(store.is_empty());
        });
    }

    #[test]
    fn a_shortened_retention_is_purged_when_it_ends() {
        runtime().block_on(async {
            let store = MemoryStore::new();
            let token = Token::random();
            let long = record(State::InFlight, token, 60_000);
            assert_eq!(store.insert("k", &long).await.unwrap(), Insert::Inserted);
            let short = record(State::Failed, token, 100);
            assert!(store.swap("k", token, &short).await.unwrap());
            tokio::time::advance(Duration::from_millis(101)).await;
            assert_eq!(store.purge_expired(10).await.unwrap(), 1);
            assert!(store.is_empty());
        });
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u64),
        Complete(u8, u64),
        Renew(u8, u64),
        Remove(u8),
        Advance(u64),
        Purge(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..6u8, 1..100u64).prop_map(|(k, r)| Op::Insert(k, r)),
            (0..6u8, 1..100u64).prop_map(|(k, r)| Op::Complete(k, r)),
            (0..6u8, 1..100u64).prop_map(|(k, r)| Op::Renew(k, r)),
            (0..6u8).prop_map(Op::Remove),
            (0..60u64).prop_map(Op::Advance),
            (0..4usize).prop_map(Op::Purge),
        ]
    }

    proptest! {
        /// Against a model of which records are held and until when: a
        /// purge deletes as many expired records as it may, only expired
        /// ones, and every record stays indexed.
        #[test]
        fn purge_takes_expired_records_and_only_those(ops in prop::collection::vec(op(), 1..80)) {
            runtime().block_on(async {
                let store = MemoryStore::new();
                // key -> (token, in flight, retention deadline)
                let mut model: HashMap<String, (Token, bool, Instant)> = HashMap::new();
                for op in ops {
                    let now = Instant::now();
                    let live = |model: &HashMap<String, (Token, bool, Instant)>, k: &str| {
                        model.get(k).filter(|(_, _, until)| now < *until).copied()
                    };
                    match op {
                        Op::Insert(k, r) => {
                            let (k, token) = (k.to_string(), Token::random());
                            let inserted = store
                                .insert(&k, &record(State::InFlight, token, r))
                                .await
                                .unwrap();
                            let expected = live(&model, &k).is_none();
                            assert_eq!(inserted == Insert::Inserted, expected);
                            if expected {
                                model.insert(k, (token, true, now + Duration::from_millis(r)));
                            }
                        }
                        Op::Complete(k, r) | Op::Renew(k, r) => {
                            let k = k.to_string();
                            let renew = matches!(op, Op::Renew(..));
                            let state = if renew { State::InFlight } else { State::Completed };
                            let held = live(&model, &k).filter(|(_, in_flight, _)| *in_flight);
                            let token = held.map_or_else(Token::random, |(t, _, _)| t);
                            let swapped = store.swap(&k, token, &record(state, token, r)).await.unwrap();
                            assert_eq!(swapped, held.is_some());
                            if swapped {
                                model.insert(k, (token, renew, now + Duration::from_millis(r)));
                            }
                        }
                        Op::Remove(k) => {
                            let k = k.to_string();
                            let held = live(&model, &k).filter(|(_, in_flight, _)| *in_flight);
                            let token = held.map_or_else(Token::random, |(t, _, _)| t);
                            let removed = store.remove(&k, token).await.unwrap();
                            assert_eq!(removed, held.is_some());
                            if removed {
                                model.remove(&k);
                            }
                        }
                        Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                        Op::Purge(limit) => {
                            let expired: Vec<String> = model
                                .iter()
                                .filter(|(_, (_, _, until))| *until <= now)
                                .map(|(k, _)| k.clone())
                                .collect();
                            let purged = store.purge_expired(limit).await.unwrap();
                            assert_eq!(purged, limit.min(expired.len()));
                            let gone: Vec<String> = model
                                .keys()
                                .filter(|k| !store.lock().records.contains_key(k.as_str()))
                                .cloned()
                                .collect();
                            assert_eq!(gone.len(), purged);
                            for k in gone {
                                assert!(expired.contains(&k), "purged the live record {k}");
                                model.remove(&k);
                            }
                        }
                    }
                    assert_eq!(store.len(), model.len());
                    assert_indexed(&store);
                }
            });
        }
    }
}
