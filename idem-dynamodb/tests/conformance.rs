//! The whole conformance kit against moto, a DynamoDB emulator in server
//! mode, each case on a table of its own that is deleted when the case
//! ends.
//!
//! This proves the store's logic (its conditions, its encoding, its
//! clock) against an emulator, not DynamoDB's own concurrency: moto runs
//! conditional writes one at a time.

mod support;

use idem_conformance::Fixture;

/// A store on a new table. The kit's cases cannot skip one by one, so an
/// emulator that does not answer skips the whole binary with the reason
/// printed (and fails it under `CI`).
async fn factory() -> Fixture {
    support::require_for_binary();
    let (store, guard) = support::fresh_store().await;
    let counted = store.clone();
    Fixture::new(store, guard).with_stored_count(move || {
        let store = counted.clone();
        async move { support::stored_records(&store).await }
    })
}

idem_conformance::store_tests!(factory);
