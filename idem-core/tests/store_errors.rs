//! A failing store: every error says whether the work ran.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use common::Runs;
use idem_core::store::{Insert, NewRecord, Record, Store, StoreError, Token};
use idem_core::{Error, Idempotent, MemoryStore, When};

/// A store whose writes after the claim can be made to fail, standing in for
/// a backend that goes away mid-call. It is a test double for failure, built
/// on the reference store.
#[derive(Debug, Default)]
struct Flaky {
    inner: MemoryStore,
    claims_fail: AtomicBool,
    writes_fail: AtomicBool,
}

fn down() -> StoreError {
    StoreError::backend("flaky", std::io::Error::other("connection reset"))
}

#[async_trait]
impl Store for Flaky {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        if self.claims_fail.load(Ordering::SeqCst) {
            return Err(down());
        }
        self.inner.insert(key, record).await
    }
    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        if self.writes_fail.load(Ordering::SeqCst) {
            return Err(down());
        }
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
        if self.writes_fail.load(Ordering::SeqCst) {
            return Err(down());
        }
        self.inner.remove(key, expected).await
    }
    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.load(key).await
    }
    async fn reset(&self, key: &str) -> Result<idem_core::store::Reset, StoreError> {
        self.inner.reset(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
}

/// Runs a work that counts itself and returns 1.
async fn counted(idem: &Idempotent, runs: &Runs) -> Result<u8, Error<String>> {
    let runs = runs.clone();
    idem.execute("k", "b", || async move {
        runs.hit();
        Ok(1)
    })
    .await
}

#[tokio::test]
async fn a_failed_claim_says_the_work_did_not_run() {
    let store = std::sync::Arc::new(Flaky::default());
    store.claims_fail.store(true, Ordering::SeqCst);
    let idem = Idempotent::new(store.clone());
    let runs = Runs::default();
    let out = counted(&idem, &runs).await;
    match out {
        Err(
            ref e @ Error::Store {
                when: When::BeforeWork,
                ref source,
            },
        ) => {
            assert!(!e.work_ran());
            assert_eq!(source.backend_name(), "flaky");
            assert!(e.to_string().contains("safe to retry"), "{e}");
            assert!(std::error::Error::source(source).is_some());
        }
        other => panic!("expected a store error before work, got {other:?}"),
    }
    assert_eq!(runs.count(), 0);
}

#[tokio::test]
async fn a_failed_completion_says_the_work_ran_and_keeps_the_key_claimed() {
    let store = std::sync::Arc::new(Flaky::default());
    store.writes_fail.store(true, Ordering::SeqCst);
    let idem = Idempotent::new(store.clone());
    let runs = Runs::default();
    let out = counted(&idem, &runs).await;
    assert!(
        matches!(out, Err(ref e @ Error::Store { when: When::AfterWork, .. }) if e.work_ran()),
        "{out:?}"
    );
    // The side effect may have happened: a retry must not run it again
    // while the lease holds.
    store.writes_fail.store(false, Ordering::SeqCst);
    let retry: Result<u8, Error<String>> = idem.execute("k", "b", || async { Ok(2) }).await;
    assert!(matches!(retry, Err(Error::InProgress { .. })), "{retry:?}");
    assert_eq!(runs.count(), 1);
}

#[tokio::test]
async fn a_failed_release_still_returns_the_work_error() {
    let store = std::sync::Arc::new(Flaky::default());
    store.writes_fail.store(true, Ordering::SeqCst);
    let idem = Idempotent::new(store);
    let out: Result<u8, Error<String>> = idem
        .execute("k", "b", || async { Err("declined".to_owned()) })
        .await;
    assert!(matches!(out, Err(Error::Work(ref e)) if e == "declined"));
}
