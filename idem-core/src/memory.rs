//! `MemoryStore`: the reference store and the executable form of the
//! [`Store`] contract.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{Fingerprint, Insert, NewRecord, Record, State, Store, StoreError, Token, Wakeups};

/// An in-process store: a map behind a mutex, on tokio's clock.
///
/// It is the reference for the [`Store`] contract, the store for tests and
/// single-process programs, and fast (no I/O). Records vanish with the
/// process. Because it reads time from [`tokio::time::Instant`], tests can
/// pause and advance the clock to lapse leases and retention without
/// sleeping. Waiters are woken in process the moment an outcome is
/// recorded or a claim released ([`Store::wakeups`]).
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<HashMap<String, Entry>>,
    wakeups: Arc<Wakeups>,
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
        self.lock().len()
    }

    /// Whether it holds no record at all.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while the lock was held cannot leave an entry half-written
        // (every change is a single insert or remove), so a poisoned map is
        // still consistent.
        self.records
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
        let mut records = self.lock();
        match records.get_mut(key) {
            Some(entry)
                if entry.is_live(now)
                    && entry.state == State::InFlight
                    && entry.token == expected
                    && also(entry, now) =>
            {
                *entry = Entry::new(record, now);
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
        let mut records = self.lock();
        match records.get(key) {
            Some(entry) if entry.is_live(now) => Ok(Insert::Found(entry.to_record(now))),
            _ => {
                records.insert(key.to_owned(), Entry::new(record, now));
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
        let mut records = self.lock();
        match records.get(key) {
            Some(entry)
                if entry.is_live(now)
                    && entry.state == State::InFlight
                    && entry.token == expected =>
            {
                records.remove(key);
                drop(records);
                self.wakeups.wake(key);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let now = Instant::now();
        let records = self.lock();
        Ok(records
            .get(key)
            .filter(|entry| entry.is_live(now))
            .map(|entry| entry.to_record(now)))
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let now = Instant::now();
        let mut records = self.lock();
        let expired: Vec<String> = records
            .iter()
            .filter(|(_, entry)| !entry.is_live(now))
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect();
        for key in &expired {
            records.remove(key);
        }
        Ok(expired.len())
    }

    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        Some(Arc::clone(&self.wakeups))
    }
}
