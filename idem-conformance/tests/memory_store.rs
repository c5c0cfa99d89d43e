//! The reference store passes the whole kit, through both entry points.

use idem_conformance::{cases, run_each, Fixture};
use idem_core::MemoryStore;

async fn factory() -> Fixture {
    Fixture::new(MemoryStore::new(), ())
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
