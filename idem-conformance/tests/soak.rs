//! The soak entry point: counts what it played, and on a broken store
//! stops with the seed and the smallest failing schedule.

// Only two of the flaws are soaked here.
#[allow(dead_code)]
mod broken;

use std::time::Duration;

use broken::{Flaw, FlawedStore};
use idem_conformance::{soak, Fixture, Interleavings};

fn settings(schedules: u32) -> Interleavings {
    Interleavings::default()
        .with_schedules(schedules)
        .with_at_once(8)
        .with_lease(Duration::from_millis(50))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_a_correct_store_counts_what_it_played() {
    let factory = || async { Fixture::new(FlawedStore::new(Flaw::None), ()) };
    let mut batches = 0;
    let soaked = soak(&factory, &settings(40), |_| batches += 1).await;
    assert!(soaked.failure.is_none(), "{:?}", soaked.failure);
    assert_eq!(soaked.schedules, 40);
    assert_eq!(batches, 5, "progress is reported once per batch of 8");
    assert!(soaked.callers >= 2 * 40 && soaked.callers <= 8 * 40);
    assert!(soaked.executions > 0, "no work ran in 40 schedules");
    assert!(
        soaked.crashes + soaked.stalls > 0,
        "no caller crashed or stalled"
    );
    assert_eq!(soaked.violations, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_a_broken_store_reports_the_seed_and_a_failing_schedule() {
    // Stalled owners complete after a takeover: the store must refuse them.
    let factory = || async { Fixture::new(FlawedStore::new(Flaw::SwapIgnoresToken), ()) };
    let soaked = soak(&factory, &settings(200).with_seed(24), |_| {}).await;
    let failure = soaked
        .failure
        .unwrap_or_else(|| panic!("200 schedules let a swap that ignores the token pass"));
    assert_eq!(failure.seed, 24);
    assert!(soaked.violations >= 1 && soaked.schedules <= 200);
    assert!(!failure.violations.is_empty());
    assert!(failure.schedule.contains("callers"), "{}", failure.schedule);
    let shown = failure.to_string();
    assert!(shown.contains("PROPTEST_RNG_SEED=24"), "{shown}");
}

#[test]
fn timeouts_scale_with_the_number_of_schedules() {
    let few = Interleavings::default();
    let many = Interleavings::default().with_schedules(10_000);
    assert_eq!(few.schedules, idem_conformance::DEFAULT_SCHEDULES);
    assert!(few.case_timeout() >= Duration::from_secs(120));
    assert!(
        many.case_timeout() > few.case_timeout() * 10,
        "{:?} for 10,000 schedules",
        many.case_timeout()
    );
}
