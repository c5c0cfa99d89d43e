//! A store wrapper that writes down every call, its caller and when it
//! started and ended, so invariants can be checked against what the store
//! actually answered.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, State, Store, StoreError, Token};
use idem_core::Fingerprint;
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
///
/// A call is written down when it starts. One whose caller was dropped
/// before the answer came back stays *in doubt*: on a networked store the
/// request may already be on the server and take effect anyway, so the
/// checks must allow both outcomes.
#[derive(Debug, Clone)]
pub(super) struct Op {
    pub(super) caller: Option<usize>,
    pub(super) call: Call,
    pub(super) key: String,
    pub(super) expected: Option<Token>,
    pub(super) written: Option<Written>,
    /// Whether it changed the record (`Inserted` or `true`); `None` while
    /// in doubt.
    pub(super) changed: Option<bool>,
    pub(super) error: Option<String>,
    pub(super) start: Instant,
    /// When the answer came back; `None` while in doubt.
    pub(super) end: Option<Instant>,
}

impl Op {
    /// Whether the call surely took effect (or surely did not) before `at`.
    pub(super) fn ended_before(&self, at: Instant) -> bool {
        self.end.is_some_and(|end| end < at)
    }
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

    /// Every call so far, in the order they started.
    pub(super) fn ops(&self) -> Vec<Op> {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Op>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes down a call as it starts, in doubt until [`Recorder::answer`].
    fn start(
        &self,
        call: Call,
        key: &str,
        expected: Option<Token>,
        record: Option<&NewRecord<'_>>,
    ) -> usize {
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
            changed: None,
            error: None,
            start: Instant::now(),
            end: None,
        };
        let mut ops = self.lock();
        ops.push(op);
        ops.len() - 1
    }

    /// Writes down the answer to call `index`; `outcome` is whether it
    /// changed the record.
    fn answer(&self, index: usize, outcome: Result<bool, &StoreError>) {
        let mut ops = self.lock();
        let op = &mut ops[index];
        op.changed = Some(matches!(outcome, Ok(true)));
        op.error = outcome.err().map(ToString::to_string);
        op.end = Some(Instant::now());
    }
}

#[async_trait]
impl Store for Recorder {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let op = self.start(Call::Insert, key, None, Some(record));
        let result = self.inner.insert(key, record).await;
        self.answer(
            op,
            result.as_ref().map(|insert| *insert == Insert::Inserted),
        );
        result
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let op = self.start(Call::Swap, key, Some(expected), Some(record));
        let result = self.inner.swap(key, expected, record).await;
        self.answer(op, result.as_ref().copied());
        result
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let op = self.start(Call::TakeOver, key, Some(expected), Some(record));
        let result = self.inner.take_over(key, expected, record).await;
        self.answer(op, result.as_ref().copied());
        result
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let op = self.start(Call::Remove, key, Some(expected), None);
        let result = self.inner.remove(key, expected).await;
        self.answer(op, result.as_ref().copied());
        result
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let op = self.start(Call::Load, key, None, None);
        let result = self.inner.load(key).await;
        self.answer(op, result.as_ref().map(|_| false));
        result
    }

    /// Passed through unrecorded: no schedule resets a key.
    async fn reset(&self, key: &str) -> Result<idem_core::store::Reset, StoreError> {
        self.inner.reset(key).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let op = self.start(Call::Purge, "", None, None);
        let result = self.inner.purge_expired(limit).await;
        self.answer(op, result.as_ref().map(|_| false));
        result
    }
}
