//! The kit has teeth: each deliberately broken store is caught by at least
//! one case, and the same store without its flaw passes every case.

mod broken;

use std::sync::Arc;
use std::time::Duration;

use broken::{Flaw, FlawedStore};
use idem_conformance::{cases, run_each, Factory, Fixture, Report};

fn flawed(flaw: Flaw) -> impl Factory {
    move || async move {
        let store = Arc::new(FlawedStore::new(flaw));
        let held = Arc::clone(&store);
        Fixture::from_arc(store, ()).with_stored_count(move || {
            let held = Arc::clone(&held);
            async move { held.len() }
        })
    }
}

async fn caught(flaw: Flaw) -> Report {
    let report = run_each(flawed(flaw)).await;
    let names: Vec<&str> = report.failures().iter().map(|f| f.case.as_str()).collect();
    println!(
        "{flaw:?} is caught by {} cases in {:.1?}: {names:#?}",
        names.len(),
        report.elapsed()
    );
    report
}

/// Asserts that the store with `flaw` fails the case named `expected`.
///
/// Only that case runs, which keeps the 46 flaws to seconds; with
/// `IDEM_BROKEN_ALL_CASES=1` the whole kit runs against each flaw and
/// prints every case that catches it.
async fn assert_caught(flaw: Flaw, expected: &str) {
    if std::env::var_os("IDEM_BROKEN_ALL_CASES").is_some() {
        let report = caught(flaw).await;
        assert!(
            report.failed(expected),
            "{flaw:?} was expected to fail {expected}; failures: {report}"
        );
        return;
    }
    let case = cases()
        .iter()
        .find(|case| case.name() == expected)
        .unwrap_or_else(|| panic!("the kit has no case named {expected}"));
    let factory: Arc<dyn Factory> = Arc::new(flawed(flaw));
    // Its own task, so the case's panic is caught as the flaw being found;
    // a case that hangs fails, as the kit's runner counts it.
    let run = tokio::spawn(async move { case.run(&*factory).await });
    match tokio::time::timeout(Duration::from_secs(120), run).await {
        Err(_) => {}
        Ok(Err(e)) if e.is_panic() => {}
        Ok(Err(e)) => panic!("{expected} was cancelled against {flaw:?}: {e}"),
        Ok(Ok(())) => panic!("the kit let a store with {flaw:?} pass {expected}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flawless_map_store_passes_every_case() {
    let report = caught(Flaw::None).await;
    assert!(report.is_success(), "{report}");
}

/// One test per flaw: the store with it must fail the named case.
macro_rules! caught {
    ($($test:ident: $flaw:ident => $case:literal,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                assert_caught(Flaw::$flaw, $case).await;
            }
        )*
    };
}

caught! {
    a_check_then_insert_claim_is_caught: CheckThenInsert => "concurrent_inserts_of_one_key_yield_exactly_one_inserted",
    a_swap_that_ignores_the_token_is_caught: SwapIgnoresToken => "swap_with_a_wrong_token_changes_nothing",
    a_remove_that_ignores_the_token_is_caught: RemoveIgnoresToken => "remove_with_a_wrong_token_changes_nothing",
    expired_records_treated_as_live_are_caught: ExpiredIsLive => "expired_record_is_absent_for_load",
    leases_that_never_lapse_are_caught: LeasesNeverLapse => "take_over_succeeds_once_the_lease_lapsed",
    a_take_over_that_ignores_the_lease_is_caught: TakeOverIgnoresLease => "take_over_fails_while_the_lease_is_live",
    truncated_payloads_are_caught: TruncatesPayloads => "large_payload_round_trips",
    payloads_stored_as_text_are_caught: StoresPayloadsAsText => "every_byte_value_round_trips",
    a_found_record_reporting_its_given_times_is_caught: FoundReportsGivenTimes => "found_record_reports_the_time_left_now",
    a_found_record_reporting_lower_bounds_is_caught: FoundReportsLowerBounds => "found_record_reports_the_time_left_now",
    a_load_reporting_given_times_is_caught: LoadReportsGivenTimes => "remaining_times_are_reported_within_bounds",
    a_renewal_that_keeps_the_retention_is_caught: RenewalKeepsRetention => "renewal_restarts_retention_from_now",
    a_renewal_that_keeps_the_lease_is_caught: RenewalKeepsLease => "swap_renews_the_lease_from_now",
    a_completion_that_keeps_the_retention_is_caught: CompletionKeepsRetention => "lease_and_retention_are_separate_clocks",
    a_take_over_that_keeps_the_lease_deadline_is_caught: TakeOverKeepsLeaseDeadline => "take_over_succeeds_once_the_lease_lapsed",
    a_claim_that_expires_with_its_lease_is_caught: ClaimExpiresWithItsLease => "lapsed_lease_keeps_the_record_live",
    an_insert_over_a_lapsed_lease_is_caught: InsertReplacesLapsedLease => "lapsed_lease_keeps_the_record_live",
    an_insert_that_finds_an_expired_record_is_caught: InsertFindsExpired => "expired_record_is_replaced_by_insert",
    a_load_of_an_expired_record_is_caught: LoadReturnsExpired => "expired_record_is_absent_for_load",
    a_swap_that_revives_an_expired_record_is_caught: SwapRevivesExpired => "expired_record_cannot_be_swapped",
    a_take_over_that_revives_an_expired_record_is_caught: TakeOverRevivesExpired => "expired_record_cannot_be_taken_over",
    a_remove_of_an_expired_record_is_caught: RemoveReportsExpired => "expired_record_cannot_be_removed",
    a_purge_of_lapsed_leases_is_caught: PurgeDeletesLapsedLeases => "purge_expired_deletes_expired_records_only",
    a_purge_of_failed_records_is_caught: PurgeDeletesFailed => "purge_expired_deletes_expired_records_only",
    a_purge_by_the_claim_s_retention_is_caught: PurgeByClaimRetention => "purge_expired_deletes_expired_records_only",
    a_purge_that_ignores_its_limit_is_caught: PurgeIgnoresLimit => "purge_expired_respects_its_limit",
    a_purge_that_deletes_nothing_is_caught: PurgeDeletesNothing => "purge_expired_leaves_no_expired_record_stored",
    a_purge_that_stops_short_of_its_limit_is_caught: PurgeStopsShort => "purge_expired_leaves_no_expired_record_stored",
    a_purge_that_reports_nothing_is_caught: PurgeReportsNothing => "purge_expired_leaves_no_expired_record_stored",
    a_check_then_write_swap_is_caught: SwapCheckThenWrite => "late_owner_and_recoverer_race_with_exactly_one_winner",
    a_check_then_write_take_over_is_caught: TakeOverCheckThenWrite => "racing_take_overs_have_exactly_one_winner",
    a_check_then_delete_remove_is_caught: RemoveCheckThenDelete => "release_and_take_over_race_with_exactly_one_winner",
    a_take_over_that_ignores_the_token_is_caught: TakeOverIgnoresToken => "take_over_with_a_wrong_token_fails",
    a_swap_of_final_records_is_caught: SwapChangesFinalRecords => "swap_on_a_completed_or_failed_record_changes_nothing",
    a_take_over_of_a_failed_record_is_caught: TakeOverReplacesFailed => "take_over_of_a_failed_record_fails",
    a_remove_of_a_failed_record_is_caught: RemoveDeletesFailed => "remove_on_a_failed_record_changes_nothing",
    an_insert_over_a_failed_record_is_caught: InsertReplacesFailed => "insert_finds_a_failed_record",
    a_swap_that_refuses_a_lapsed_lease_is_caught: SwapRefusesLapsedLease => "swap_by_a_late_owner_succeeds_when_nobody_took_over",
    an_empty_payload_read_as_corrupt_is_caught: EmptyPayloadIsCorrupt => "empty_payload_round_trips",
    truncated_tokens_are_caught: TruncatesTokens => "tokens_and_fingerprints_round_trip",
    truncated_fingerprints_are_caught: TruncatesFingerprints => "tokens_and_fingerprints_round_trip",
    dropped_fingerprint_schemes_are_caught: DropsFingerprintScheme => "fingerprint_schemes_round_trip",
    case_folded_keys_are_caught: FoldsKeyCase => "distinct_keys_hold_distinct_records",
    truncated_keys_are_caught: TruncatesKeys => "longest_keys_are_kept_apart",
    a_reset_that_deletes_in_flight_records_is_caught: ResetDeletesInFlight => "reset_refuses_an_in_flight_record",
    a_reset_that_skips_failed_records_is_caught: ResetSkipsFailed => "reset_deletes_a_failed_record",
    a_reset_that_reports_expired_records_is_caught: ResetReportsExpired => "reset_of_an_absent_or_expired_key_changes_nothing",
    a_check_then_delete_reset_is_caught: ResetCheckThenDelete => "reset_racing_replays_and_claims_has_one_winner",
    a_reset_that_rewrites_instead_of_deleting_is_caught: ResetRewritesAsLapsedClaim => "reset_never_lets_a_stale_owner_complete",
}
