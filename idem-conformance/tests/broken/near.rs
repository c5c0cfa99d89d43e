//! A near cache like `idem_core::store::NearCache`, with one deliberate
//! flaw switched on: the near-cache cases must catch each. Each flaw is a
//! mistake a cache in front of an idempotency store is easily built with.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token};
use tokio::time::Instant;

/// The bug a [`FlawedCache`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheFlaw {
    /// None: the control, which must pass every case.
    None,
    /// Keeps every record it sees, in flight too.
    KeepsInFlight,
    /// Keeps a record for the cap, whatever retention the store reported.
    IgnoresRetention,
    /// Keeps a record for the retention the store reported, past the cap.
    IgnoresCap,
    /// Answers from a key alone: the record it returns carries the
    /// fingerprint of the request that asked, so any body replays.
    AnswersByKeyAlone,
    /// Remembers that a key was absent when it read it, and then takes
    /// the key as its own without heeding what the store's claim found.
    TrustsRememberedAbsence,
    /// Forgets a key only before a reset deletes it, and keeps what a read
    /// in flight across the reset brings back: the deleted record.
    KeepsReadsAcrossResets,
}

/// A map of kept records in front of a store, with one [`CacheFlaw`].
#[derive(Debug)]
pub(crate) struct FlawedCache {
    flaw: CacheFlaw,
    inner: Arc<dyn Store>,
    max_age: Duration,
    kept: Mutex<HashMap<String, (Record, Instant)>>,
    absent: Mutex<HashSet<String>>,
    /// Resets begun or ended: a read that began before the last one is
    /// not kept.
    resets: AtomicU64,
}

impl FlawedCache {
    pub(crate) fn new(flaw: CacheFlaw, inner: Arc<dyn Store>, max_age: Duration) -> FlawedCache {
        FlawedCache {
            flaw,
            inner,
            max_age,
            kept: Mutex::default(),
            absent: Mutex::default(),
            resets: AtomicU64::new(0),
        }
    }

    fn kept(&self) -> MutexGuard<'_, HashMap<String, (Record, Instant)>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn resets(&self) -> u64 {
        self.resets.load(Ordering::SeqCst)
    }

    fn keep(&self, key: &str, record: &Record, asked: Instant, resets: u64) {
        let settled = matches!(record.state, State::Completed | State::Failed);
        if !settled && self.flaw != CacheFlaw::KeepsInFlight {
            return;
        }
        let life = match self.flaw {
            CacheFlaw::IgnoresRetention => self.max_age,
            CacheFlaw::IgnoresCap => record.retention_remaining,
            _ => record.retention_remaining.min(self.max_age),
        };
        let mut kept = self.kept();
        if self.resets() != resets && self.flaw != CacheFlaw::KeepsReadsAcrossResets {
            return;
        }
        kept.insert(key.to_owned(), (record.clone(), asked + life));
    }
}

#[async_trait]
impl Store for FlawedCache {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let now = Instant::now();
        if let Some((kept, until)) = self.kept().get(key).cloned() {
            if until > now {
                let mut found = kept;
                found.retention_remaining = until - now;
                if self.flaw == CacheFlaw::AnswersByKeyAlone {
                    found.fingerprint = record.fingerprint;
                }
                return Ok(Insert::Found(found));
            }
        }
        let remembered = self.flaw == CacheFlaw::TrustsRememberedAbsence
            && self
                .absent
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(key);
        let resets = self.resets();
        let answer = self.inner.insert(key, record).await?;
        if remembered {
            return Ok(Insert::Inserted);
        }
        if let Insert::Found(found) = &answer {
            self.keep(key, found, now, resets);
        }
        Ok(answer)
    }

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

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        let forget = || {
            let mut kept = self.kept();
            self.resets.fetch_add(1, Ordering::SeqCst);
            kept.remove(key);
        };
        forget();
        let answer = self.inner.reset(key).await;
        if self.flaw != CacheFlaw::KeepsReadsAcrossResets {
            forget();
        }
        answer
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let (asked, resets) = (Instant::now(), self.resets());
        let record = self.inner.load(key).await?;
        match &record {
            Some(read) => self.keep(key, read, asked, resets),
            None if self.flaw == CacheFlaw::TrustsRememberedAbsence => {
                self.absent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key.to_owned());
            }
            None => {}
        }
        Ok(record)
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
}
