//! Retry storms against an in-process payments API: every intended payment
//! must be charged exactly once.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::Store;
use idem_demo::{storm_in_process, Report, StormConfig};
use idem_testing::{StoreKind, TestStore};

/// A storm small enough for a test run, with a fixed seed so that its plans
/// (races, drops, retries, altered bodies) are the same every time.
fn small_storm() -> StormConfig {
    let mut config = StormConfig::default();
    config.clients = 8;
    config.payments = 60;
    config.seed = 7;
    // A payment stuck longer than this is a bug to report, not to wait out.
    config.give_up_after = Duration::from_secs(10);
    config
}

async fn storm(store: Arc<dyn Store>) -> Report {
    let report = storm_in_process(store, &small_storm())
        .await
        .expect("the storm runs");
    println!("{report}");
    report
}

fn assert_exactly_once(report: &Report) {
    assert_eq!(report.double_charged, 0, "payments charged twice\n{report}");
    assert_eq!(report.missing, 0, "payments never charged\n{report}");
    assert_eq!(report.wrong, 0, "wrong charges or answers\n{report}");
    assert_eq!(report.charged, report.intended, "{report}");
    assert!(report.passed());
    // The storm must have pressed: without retries, races and altered
    // bodies it would prove nothing.
    assert!(report.replays > 0, "no replay seen\n{report}");
    assert!(report.mismatches > 0, "no altered body sent\n{report}");
    assert!(report.requests > 2 * report.intended as u64, "{report}");
}

/// Every store of the one list (`idem-stores`, through `idem-testing`),
/// each storm on a fresh file, prefix or table, side by side; a store whose
/// server is unreachable is skipped with a printed reason (a failure under
/// `CI`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_over_every_store_charges_every_payment_exactly_once() {
    let mut storms = tokio::task::JoinSet::new();
    for kind in StoreKind::ALL {
        storms.spawn(async move {
            let Some(fresh) = kind.fresh().await else {
                return;
            };
            println!("storm over {kind}");
            let report = storm(fresh.store).await;
            drop(fresh.guard);
            assert_exactly_once(&report);
        });
    }
    while let Some(storm) = storms.join_next().await {
        if let Err(failed) = storm {
            std::panic::resume_unwind(failed.into_panic());
        }
    }
}

#[test]
fn the_storm_command_exits_zero_when_exactly_once_holds() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idem-demo"))
        .args(["storm", "--clients", "4", "--payments", "30", "--seed", "3"])
        .args(["--give-up-after-secs", "10"])
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "storm failed: {:?}\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("charges intended"), "{stdout}");
    assert!(stdout.contains("exactly once"), "{stdout}");
}
