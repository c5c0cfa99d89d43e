//! The one list of cases. `run_all`, `run_each`, [`cases`](crate::cases())
//! and [`store_tests!`](crate::store_tests) all expand from it, so a case
//! added here runs everywhere.

/// Hands the case list, grouped by module, to the macro named
/// `$callback` in this crate.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($callback:ident ! $args:tt) => {
        $crate::$callback! { $args
            claim {
                insert_stores_a_record_when_the_key_is_absent,
                insert_leaves_a_live_record_untouched_and_returns_it,
                insert_finds_a_completed_record,
                insert_finds_a_failed_record,
                found_record_reports_the_time_left_now,
                load_returns_none_for_an_absent_key,
                distinct_keys_hold_distinct_records,
            }
            swap {
                swap_with_the_owner_token_replaces_the_record,
                swap_with_a_wrong_token_changes_nothing,
                swap_on_a_completed_or_failed_record_changes_nothing,
                swap_on_an_absent_key_creates_nothing,
                swap_renews_the_lease_from_now,
                renewal_restarts_retention_from_now,
                swap_by_a_late_owner_succeeds_when_nobody_took_over,
                remove_with_the_owner_token_deletes_the_record,
                remove_with_a_wrong_token_changes_nothing,
                remove_on_a_completed_record_changes_nothing,
                remove_on_a_failed_record_changes_nothing,
                remove_on_an_absent_key_returns_false,
            }
            fencing {
                take_over_fails_while_the_lease_is_live,
                take_over_succeeds_once_the_lease_lapsed,
                take_over_fails_after_the_owner_renewed,
                take_over_with_a_wrong_token_fails,
                take_over_of_a_completed_record_fails,
                take_over_of_a_failed_record_fails,
                stale_token_changes_nothing_after_a_take_over,
            }
            expiry {
                lapsed_lease_keeps_the_record_live,
                expired_record_is_absent_for_load,
                expired_record_is_replaced_by_insert,
                expired_record_cannot_be_swapped,
                expired_record_cannot_be_taken_over,
                expired_record_cannot_be_removed,
                remaining_times_are_reported_within_bounds,
                lease_and_retention_are_separate_clocks,
                purge_expired_deletes_expired_records_only,
                purge_expired_respects_its_limit,
                purge_expired_leaves_no_expired_record_stored,
            }
            fidelity {
                empty_payload_round_trips,
                large_payload_round_trips,
                every_byte_value_round_trips,
                tokens_and_fingerprints_round_trip,
                fingerprint_schemes_round_trip,
                keys_with_every_visible_ascii_character_are_kept_apart,
                longest_keys_are_kept_apart,
                many_keys_are_held_at_once,
            }
            concurrency {
                concurrent_inserts_of_one_key_yield_exactly_one_inserted,
                racing_take_overs_have_exactly_one_winner,
                late_owner_and_recoverer_race_with_exactly_one_winner,
                release_and_take_over_race_with_exactly_one_winner,
                concurrent_executes_run_the_work_once,
            }
            execute {
                replays_without_running_the_work_again,
                replays_falsy_outcomes_exactly,
                another_body_after_completion_is_a_mismatch,
                another_body_while_in_flight_is_a_mismatch,
                same_body_while_in_flight_is_in_progress,
                released_errors_run_again,
                remembered_failures_replay,
                scopes_are_isolated,
            }
            recovery {
                cancelled_call_is_taken_over_by_one_recoverer_after_its_lease,
                stale_owner_gets_lease_lost_and_changes_nothing,
                heartbeat_keeps_a_lease_past_its_length,
            }
            reset {
                reset_deletes_a_completed_record,
                reset_deletes_a_failed_record,
                reset_refuses_an_in_flight_record,
                reset_of_an_absent_or_expired_key_changes_nothing,
                reset_racing_replays_and_claims_has_one_winner,
                reset_never_lets_a_stale_owner_complete,
            }
            interleaving {
                generated_schedules_keep_every_invariant,
            }
            chunks {
                a_settled_insert_is_stored_as_it_is,
                chunks_read_back_in_order_and_whole,
                chunks_lapse_after_their_record,
                a_stale_owners_chunks_are_never_read,
            }
            steps {
                in_flight_swap_keeps_its_payload_and_rotates_the_token,
                take_over_writes_the_payload_it_is_given,
                durable_steps_resume_after_the_owner_is_dropped,
            }
        }
    };
}

/// Builds the table behind [`cases`](crate::cases()).
#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    ({} $($group:ident { $($case:ident),* $(,)? })*) => {
        pub(crate) static CASES: &[$crate::Case] = &[
            $($(
                $crate::Case::new(
                    stringify!($group),
                    stringify!($case),
                    |factory| ::std::boxed::Box::pin($crate::cases::$group::$case(factory)),
                ),
            )*)*
        ];
    };
}

/// Emits one test per case; see [`store_tests!`](crate::store_tests).
#[doc(hidden)]
#[macro_export]
macro_rules! __emit_tests {
    ({ $factory:path } $($group:ident { $($case:ident),* $(,)? })*) => {
        $(
            #[allow(unused_imports)]
            mod $group {
                use super::*;
                // The test attribute names its runtime `tokio`; this lets it
                // resolve in a crate that depends on no tokio of its own.
                use $crate::__private::tokio;

                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        $crate::__private::run_case(&$factory, $crate::cases::$group::$case).await;
                    }
                )*
            }
        )*
    };
}

/// Emits one `#[tokio::test]` per conformance case, in one module per
/// group (`claim::insert_stores_a_record_when_the_key_is_absent`, …), for
/// the factory at `$factory`.
///
/// The calling crate needs no dependency beyond this crate and its store.
/// Each test runs on a multi-threaded runtime with two workers.
///
/// ```no_run
/// use idem_conformance::Fixture;
/// use idem_core::MemoryStore;
///
/// async fn factory() -> Fixture {
///     Fixture::new(MemoryStore::new(), ())
/// }
///
/// idem_conformance::store_tests!(factory);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! store_tests {
    ($factory:path) => {
        $crate::__with_cases! { __emit_tests! { $factory } }
    };
}
