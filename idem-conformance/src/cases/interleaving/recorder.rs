//! A store wrapper that writes down every call, its caller and when it
//! started and ended, so invariants can be checked against what the store
//! actually answered.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Fingerprint, Insert, NewRecord, Record, State, Store, StoreError, Token};
use tokio::time::Instant;

tokio::task_local! {
    /// The schedule's caller the current task acts for.
    pub(super) static CALLER: usize;
}

/// Which method was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    Insert,
    Swap,
    TakeOver,
    Remove,
    Load,
    Purge,
}

/// The record a call asked to write.
#[derive(Debug, Clone)]
pub(super) struct Written {
    pub(super) token: Token,
    pub(super) fingerprint: Fingerprint,
    pub(super) state: State,
    pub(super) payload: Vec<u8>,
    pub(super) lease: Option<Duration>,
}

/// One store call, as seen from outside the store.
#[derive(Debug, Clone)]
pub(super) struct Op {
    pub(super) caller: Option<usize>,
    pub(super) call: Call,
    pub(super) key: String,
    pub(super) expected: Option<Token>,
    pub(super) written: Option<Written>,
    /// Whether it changed the record: `Inserted` or `true`.
    pub(super) changed: bool,
    pub(super) error: Option<String>,
    pub(super) start: Instant,
    pub(super) end: Instant,
}

/// Wraps the store under test.
#[derive(Debug)]
pub(super) struct Recorder {
    inner: Arc<dyn Store>,
    ops: Mutex<Vec<Op>>,
}

impl Recorder {
    pub(super) fn new(inner: Arc<dyn Store>) -> Recorder {
        Recorder {
            inner,
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Every call so far, in the order they ended.
    pub(super) fn ops(&self) -> Vec<Op> {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Op>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes down one call; `outcome` is whether it changed the record.
    fn note(
        &self,
        call: Call,
        key: &str,
        expected: Option<Token>,
        record: Option<&NewRecord<'_>>,
        start: Instant,
        outcome: Result<bool, &StoreError>,
    ) {
        let op = Op {
            caller: CALLER.try_with(|caller| *caller).ok(),
            call,
            key: key.to_owned(),
            expected,
            written: record.map(|r| Written {
                token: r.token,
                fingerprint: r.fingerprint,
                state: r.state,
                payload: r.payload.to_vec(),
                lease: r.lease,
            }),
            changed: matches!(outcome, Ok(true)),
            error: outcome.err().map(ToString::to_string),
            start,
            end: Instant::now(),
        };
        self.lock().push(op);
    }
}

#[async_trait]
impl Store for Recorder {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let start = Instant::now();
        let result = self.inner.insert(key, record).await;
        let outcome = result.as_ref().map(|insert| *insert == Insert::Inserted);
        self.note(Call::Insert, key, None, Some(record), start, outcome);
        result
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let start = Instant::now();
        let result = self.inner.swap(key, expected, record).await;
        let outcome = result.as_ref().copied();
        self.note(
            Call::Swap,
            key,
            Some(expected),
            Some(record),
            start,
            outcome,
        );
        result
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let start = Instant::now();
        let result = self.inner.take_over(key, expected, record).await;
        let outcome = result.as_ref().copied();
        self.note(
            Call::TakeOver,
            key,
            Some(expected),
            Some(record),
            start,
            outcome,
        );
        result
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let start = Instant::now();
        let result = self.inner.remove(key, expected).await;
        let outcome = result.as_ref().copied();
        self.note(Call::Remove, key, Some(expected), None, start, outcome);
        result
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let start = Instant::now();
        let result = self.inner.load(key).await;
        let outcome = result.as_ref().map(|_| false);
        self.note(Call::Load, key, None, None, start, outcome);
        result
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let start = Instant::now();
        let result = self.inner.purge_expired(limit).await;
        let outcome = result.as_ref().map(|_| false);
        self.note(Call::Purge, "", None, None, start, outcome);
        result
    }
}
