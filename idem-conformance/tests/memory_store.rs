//! The reference store passes the whole kit, through both entry points.

use std::sync::Arc;

use idem_conformance::{cases, run_each, Fixture};
use idem_core::MemoryStore;

async fn factory() -> Fixture {
    let store = Arc::new(MemoryStore::new());
    let held = Arc::clone(&store);
    // The map's own length counts records past retention until purged.
    Fixture::from_arc(store, ()).with_stored_count(move || {
        let held = Arc::clone(&held);
        async move { held.len() }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_passes_every_case() {
    let report = run_each(factory).await;
    println!("{report}");
    assert!(report.is_success(), "{report}");
    assert_eq!(report.passed().len(), cases().len());
}

// The macro as a store crate uses it: one test per case.
mod per_case {
    use super::factory;

    idem_conformance::store_tests!(factory);
}

/// The whole kit again, through a near cache in front of the store.
mod near_cache {
    async fn factory() -> idem_conformance::Fixture {
        super::factory().await.with_near_cache()
    }

    idem_conformance::store_tests!(factory);
}

/// The reference store with every answer held back after the change is
/// made, as a networked store answers: a caller dropped while waiting has
/// still changed the record.
#[derive(Debug, Default)]
struct LateAnswers(MemoryStore);

async fn late<T>(answer: T) -> T {
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    answer
}

#[async_trait::async_trait]
impl idem_core::store::Store for LateAnswers {
    async fn insert(
        &self,
        key: &str,
        record: &idem_core::store::NewRecord<'_>,
    ) -> Result<idem_core::store::Insert, idem_core::store::StoreError> {
        late(self.0.insert(key, record).await).await
    }
    async fn swap(
        &self,
        key: &str,
        expected: idem_core::store::Token,
        record: &idem_core::store::NewRecord<'_>,
    ) -> Result<bool, idem_core::store::StoreError> {
        late(self.0.swap(key, expected, record).await).await
    }
    async fn take_over(
        &self,
        key: &str,
        expected: idem_core::store::Token,
        record: &idem_core::store::NewRecord<'_>,
    ) -> Result<bool, idem_core::store::StoreError> {
        late(self.0.take_over(key, expected, record).await).await
    }
    async fn remove(
        &self,
        key: &str,
        expected: idem_core::store::Token,
    ) -> Result<bool, idem_core::store::StoreError> {
        late(self.0.remove(key, expected).await).await
    }
    async fn load(
        &self,
        key: &str,
    ) -> Result<Option<idem_core::store::Record>, idem_core::store::StoreError> {
        late(self.0.load(key).await).await
    }
    async fn reset(
        &self,
        key: &str,
    ) -> Result<idem_core::store::Reset, idem_core::store::StoreError> {
        late(self.0.reset(key).await).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, idem_core::store::StoreError> {
        late(self.0.purge_expired(limit).await).await
    }
}

// Regression: the interleaving suite noted a store call only when it
// answered, so a caller cancelled mid-call on a networked store left a
// change the checker never saw and blamed on the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correct_store_that_answers_late_passes_the_interleavings() {
    let factory = || async { Fixture::new(LateAnswers::default(), ()) };
    for _ in 0..3 {
        cases::interleaving::generated_schedules_keep_every_invariant(&factory).await;
    }
}
