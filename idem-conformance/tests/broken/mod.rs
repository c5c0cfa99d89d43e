//! A map store like `MemoryStore`, with one deliberate flaw switched on:
//! the kit must catch each.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Fingerprint, Insert, NewRecord, Record, State, Store, StoreError, Token};
use tokio::time::Instant;

/// The bug a [`FlawedStore`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flaw {
    /// None: the control, which must pass everything.
    None,
    /// `insert` looks, yields, then writes: two racing claims both win.
    CheckThenInsert,
    /// `swap` replaces an InFlight record whatever the token.
    SwapIgnoresToken,
    /// `remove` deletes an InFlight record whatever the token.
    RemoveIgnoresToken,
    /// Records past retention are still returned and still block claims.
    ExpiredIsLive,
    /// Leases never lapse: `take_over` always fails and the lease left never
    /// reaches zero.
    LeasesNeverLapse,
    /// `take_over` does not check the lease: a live owner loses its key.
    TakeOverIgnoresLease,
    /// Payloads over 1 MiB are cut to 1 MiB, as a column size limit would.
    TruncatesPayloads,
    /// Payloads are stored as text, so bytes that are not UTF-8 are replaced.
    StoresPayloadsAsText,
}

#[derive(Debug, Clone)]
struct Entry {
    token: Token,
    fingerprint: Fingerprint,
    state: State,
    payload: Vec<u8>,
    lease_until: Option<Instant>,
    retain_until: Instant,
}

/// A map behind a mutex with one [`Flaw`].
#[derive(Debug)]
pub(crate) struct FlawedStore {
    flaw: Flaw,
    records: Mutex<HashMap<String, Entry>>,
}

impl FlawedStore {
    pub(crate) fn new(flaw: Flaw) -> FlawedStore {
        FlawedStore {
            flaw,
            records: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn entry(&self, record: &NewRecord<'_>, now: Instant) -> Entry {
        let payload = match self.flaw {
            Flaw::TruncatesPayloads => record.payload[..record.payload.len().min(1 << 20)].to_vec(),
            Flaw::StoresPayloadsAsText => String::from_utf8_lossy(record.payload)
                .into_owned()
                .into_bytes(),
            _ => record.payload.to_vec(),
        };
        Entry {
            token: record.token,
            fingerprint: record.fingerprint,
            state: record.state,
            payload,
            lease_until: record.lease.map(|lease| now + lease),
            retain_until: now + record.retention,
        }
    }

    fn is_live(&self, entry: &Entry, now: Instant) -> bool {
        self.flaw == Flaw::ExpiredIsLive || now < entry.retain_until
    }

    fn record(&self, entry: &Entry, now: Instant) -> Record {
        let lease_remaining = entry.lease_until.map(|until| match self.flaw {
            Flaw::LeasesNeverLapse => until
                .saturating_duration_since(now)
                .max(Duration::from_millis(1)),
            _ => until.saturating_duration_since(now),
        });
        Record {
            token: entry.token,
            fingerprint: entry.fingerprint,
            state: entry.state,
            payload: entry.payload.clone(),
            lease_remaining,
            retention_remaining: entry.retain_until.saturating_duration_since(now),
        }
    }

    /// Whether the live InFlight entry under `key` may be changed by a
    /// holder of `expected`.
    fn owned(
        &self,
        entry: Option<&Entry>,
        expected: Token,
        token_checked: bool,
        now: Instant,
    ) -> bool {
        entry.is_some_and(|entry| {
            self.is_live(entry, now)
                && entry.state == State::InFlight
                && (!token_checked || entry.token == expected)
        })
    }
}

#[async_trait]
impl Store for FlawedStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        if self.flaw == Flaw::CheckThenInsert {
            let now = Instant::now();
            if let Some(entry) = self.lock().get(key).filter(|e| self.is_live(e, now)) {
                return Ok(Insert::Found(self.record(entry, now)));
            }
            tokio::task::yield_now().await;
            let entry = self.entry(record, Instant::now());
            self.lock().insert(key.to_owned(), entry);
            return Ok(Insert::Inserted);
        }
        let now = Instant::now();
        let mut records = self.lock();
        match records.get(key) {
            Some(entry) if self.is_live(entry, now) => Ok(Insert::Found(self.record(entry, now))),
            _ => {
                records.insert(key.to_owned(), self.entry(record, now));
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
        let now = Instant::now();
        let mut records = self.lock();
        let checked = self.flaw != Flaw::SwapIgnoresToken;
        if !self.owned(records.get(key), expected, checked, now) {
            return Ok(false);
        }
        records.insert(key.to_owned(), self.entry(record, now));
        Ok(true)
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        if self.flaw == Flaw::LeasesNeverLapse {
            return Ok(false);
        }
        let now = Instant::now();
        let mut records = self.lock();
        let entry = records.get(key);
        let lapsed = self.flaw == Flaw::TakeOverIgnoresLease
            || entry.is_some_and(|e| e.lease_until.is_none_or(|until| now >= until));
        if !lapsed || !self.owned(entry, expected, true, now) {
            return Ok(false);
        }
        records.insert(key.to_owned(), self.entry(record, now));
        Ok(true)
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut records = self.lock();
        let checked = self.flaw != Flaw::RemoveIgnoresToken;
        if !self.owned(records.get(key), expected, checked, now) {
            return Ok(false);
        }
        records.remove(key);
        Ok(true)
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let now = Instant::now();
        let records = self.lock();
        Ok(records
            .get(key)
            .filter(|entry| self.is_live(entry, now))
            .map(|entry| self.record(entry, now)))
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let now = Instant::now();
        let mut records = self.lock();
        let expired: Vec<String> = records
            .iter()
            .filter(|(_, entry)| !self.is_live(entry, now))
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect();
        for key in &expired {
            records.remove(key);
        }
        Ok(expired.len())
    }
}
