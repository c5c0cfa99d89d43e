//! `idem-demo webhooks` run as a process: signed deliveries with resends,
//! forgeries and stale replays go through the receiver; workers retry
//! flaky events with backoff and park poison ones; under `--chaos` the
//! worker process is killed with SIGKILL and restarted. Every run must end
//! with each event's effect made once, none lost, and the table says so.

use std::process::Command;

/// How many times the chaos runs kill the worker (`IDEM_WEBHOOKS_KILLS`
/// raises it).
fn kills() -> String {
    std::env::var("IDEM_WEBHOOKS_KILLS").unwrap_or_else(|_| "3".to_owned())
}

/// Runs the demo with `args`; whether it passed, and what it printed.
fn demo(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_idem-demo"))
        .arg("webhooks")
        .args(args)
        .args(["--give-up-after-secs", "60"])
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    (output.status.success(), stdout)
}

/// The number on the table's row `name`.
fn row(stdout: &str, name: &str) -> u64 {
    stdout
        .lines()
        .find_map(|line| line.trim_start().strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no row {name:?} in\n{stdout}"))
}

/// The checks every run must pass, whatever its size.
fn check(passed: bool, stdout: &str, events: u64) {
    assert!(passed, "the demo failed\n{stdout}");
    assert_eq!(row(stdout, "events sent"), events);
    assert_eq!(row(stdout, "duplicates"), 0, "{stdout}");
    assert_eq!(row(stdout, "lost"), 0, "{stdout}");
    assert_eq!(row(stdout, "enqueued"), events, "{stdout}");
    // One effect per event that is not poison, and each of those handled.
    let dead = row(stdout, "dead-lettered");
    assert!(
        dead >= 1,
        "no poison event reached the dead letters\n{stdout}"
    );
    assert_eq!(row(stdout, "effects"), events - dead, "{stdout}");
    assert_eq!(row(stdout, "handled"), events - dead, "{stdout}");
    assert!(
        row(stdout, "deliveries") > events,
        "no event was resent\n{stdout}"
    );
    assert!(row(stdout, "retried") >= 1, "nothing was retried\n{stdout}");
    assert!(stdout.contains("PASS"), "{stdout}");
}

#[test]
fn the_webhooks_demo_handles_every_event_once_on_sqlite() {
    let (passed, stdout) = demo(&["--events", "80", "--seed", "7"]);
    check(passed, &stdout, 80);
    assert_eq!(row(&stdout, "worker kills"), 0);
}

#[test]
fn the_webhooks_demo_survives_kill_9_of_its_worker_on_sqlite() {
    let (passed, stdout) = demo(&["--events", "200", "--chaos", &kills()]);
    check(passed, &stdout, 200);
    assert!(
        row(&stdout, "worker kills") >= 1,
        "the worker was never killed\n{stdout}"
    );
}

#[test]
fn the_webhooks_demo_survives_kill_9_of_its_worker_on_postgres() {
    let Some(url) = idem_testing::Server::Postgres.require() else {
        return;
    };
    let (passed, stdout) = demo(&["--events", "200", "--chaos", &kills(), "--store", &url]);
    check(passed, &stdout, 200);
    assert!(
        row(&stdout, "worker kills") >= 1,
        "the worker was never killed\n{stdout}"
    );
}

#[test]
fn an_unknown_store_is_refused_with_a_clear_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_idem-demo"))
        .args(["webhooks", "--store", "redis://127.0.0.1"])
        .output()
        .expect("the binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("sqlite:DIR or postgres://"), "{stderr}");
}
