//! The kit has teeth: each deliberately broken store is caught by at least
//! one case, and the same store without its flaw passes every case.

mod broken;

use broken::{Flaw, FlawedStore};
use idem_conformance::{run_each, Fixture, Report};

async fn caught(flaw: Flaw) -> Report {
    let report = run_each(move || async move { Fixture::new(FlawedStore::new(flaw), ()) }).await;
    let names: Vec<&str> = report.failures().iter().map(|f| f.case.as_str()).collect();
    println!(
        "{flaw:?} is caught by {} cases in {:.1?}: {names:#?}",
        names.len(),
        report.elapsed()
    );
    report
}

async fn assert_caught(flaw: Flaw, expected: &str) {
    let report = caught(flaw).await;
    assert!(
        !report.is_success(),
        "the kit let a store with {flaw:?} pass"
    );
    assert!(
        report.failed(expected),
        "{flaw:?} was expected to fail {expected}; failures: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flawless_map_store_passes_every_case() {
    let report = caught(Flaw::None).await;
    assert!(report.is_success(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_then_insert_claim_is_caught() {
    assert_caught(
        Flaw::CheckThenInsert,
        "concurrent_inserts_of_one_key_yield_exactly_one_inserted",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_that_ignores_the_token_is_caught() {
    assert_caught(
        Flaw::SwapIgnoresToken,
        "swap_with_a_wrong_token_changes_nothing",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remove_that_ignores_the_token_is_caught() {
    assert_caught(
        Flaw::RemoveIgnoresToken,
        "remove_with_a_wrong_token_changes_nothing",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_records_treated_as_live_are_caught() {
    assert_caught(Flaw::ExpiredIsLive, "expired_record_is_absent_for_load").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_that_never_lapse_are_caught() {
    assert_caught(
        Flaw::LeasesNeverLapse,
        "take_over_succeeds_once_the_lease_lapsed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_that_ignores_the_lease_is_caught() {
    assert_caught(
        Flaw::TakeOverIgnoresLease,
        "take_over_fails_while_the_lease_is_live",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_payloads_are_caught() {
    assert_caught(Flaw::TruncatesPayloads, "large_payload_round_trips").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_stored_as_text_are_caught() {
    assert_caught(Flaw::StoresPayloadsAsText, "every_byte_value_round_trips").await;
}
