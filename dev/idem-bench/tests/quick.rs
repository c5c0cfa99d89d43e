//! The harness runs end to end on the memory store: it prints a ratio line
//! per cell and draws its chart. Speed is not asserted: CI machines vary.

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idem-bench"))
}

#[test]
fn quick_mode_on_the_memory_store_prints_every_ratio_line_and_draws_a_chart() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let chart = dir.path().join("chart.png");
    let output = bench()
        .args([
            "--quick",
            "--stores",
            "memory",
            "--duration",
            "20ms",
            "--reps",
            "1",
        ])
        .args(["--replay-keys", "10", "--chart"])
        .arg(&chart)
        .output()
        .expect("the harness starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        output.status
    );
    for workload in ["first", "replay", "contended"] {
        for concurrency in ["c1", "c32"] {
            let prefix = format!("ratio memory {workload} {concurrency} ");
            let line = stdout
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no line {prefix:?} in\n{stdout}"));
            let value: f64 = line[prefix.len()..].parse().expect("a number");
            assert!(value.is_finite() && value > 0.0, "{line}");
        }
        assert!(
            stdout.contains(&format!("overhead memory {workload} c1 ")),
            "{stdout}"
        );
    }
    let png = std::fs::read(&chart).expect("the chart was written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn help_explains_the_options() {
    let output = bench().arg("--help").output().expect("the harness starts");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    for option in [
        "--quick",
        "--stores",
        "--redis-url",
        "--postgres-url",
        "--duration",
        "--ops",
    ] {
        assert!(help.contains(option), "{option} missing from\n{help}");
    }
    for option in ["--concurrency", "--http", "--chart"] {
        assert!(help.contains(option), "{option} missing from\n{help}");
    }
}

#[test]
fn an_unknown_store_is_refused() {
    let output = bench()
        .args(["--stores", "mongo", "--duration", "10ms"])
        .output()
        .expect("the harness starts");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown store"));
}

/// The inbox figures run end to end in quick mode: an acknowledgement line
/// per queue and a worker-against-raw ratio per backend and kind of work. PostgreSQL
/// must be up (as for the store rows); the figures themselves are not
/// asserted.
#[test]
fn quick_inbox_mode_prints_acknowledgement_and_throughput_lines() {
    let output = bench()
        .args(["--quick", "--stores", "none", "--inbox"])
        .output()
        .expect("the harness starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("inbox-ack sqlite c32 n=320 "), "{stdout}");
    assert_ratios(&stdout, "sqlite");
    if stderr.contains("unreachable") {
        assert!(std::env::var_os("CI").is_none(), "{stderr}");
        eprintln!("skipped the PostgreSQL rows: {stderr}");
        return;
    }
    assert!(stdout.contains("inbox-ack postgres c32 n=320 "), "{stdout}");
    assert_ratios(&stdout, "postgres");
    assert_ratios(&stdout, "postgres-shared");
}

/// A finite, positive worker-to-raw ratio for `backend` per kind of work.
fn assert_ratios(stdout: &str, backend: &str) {
    for work in ["0ms", "2ms"] {
        let prefix = format!("ratio inbox-jobs {backend} work={work} ");
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in\n{stdout}"));
        let value: f64 = line[prefix.len()..].parse().expect("a number");
        assert!(value.is_finite() && value > 0.0, "{line}");
    }
}

#[test]
fn scale_mode_fills_measures_weighs_and_purges_the_in_process_stores() {
    let output = bench()
        .args(["--scale", "--quick", "--stores", "memory,sqlite"])
        .args([
            "--scale-sizes",
            "300,3k",
            "--duration",
            "30ms",
            "--reps",
            "1",
        ])
        .args(["--scale-rate", "200", "--scale-retention", "300ms"])
        .args(["--scale-purge-every", "50ms", "--scale-window", "400ms"])
        .output()
        .expect("the harness starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Success also means every replay found and decoded its bulk record:
    // a bulk key whose work ran counts as an error.
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        output.status
    );
    for store in ["memory", "sqlite"] {
        for workload in ["first", "replay"] {
            for concurrency in ["c1", "c32"] {
                let prefix = format!("growth {store} {workload} {concurrency} 3k/300 p50 ");
                let line = stdout
                    .lines()
                    .find(|l| l.starts_with(&prefix))
                    .unwrap_or_else(|| panic!("no line {prefix:?} in\n{stdout}"));
                let value: f64 = line[prefix.len()..]
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("a number");
                assert!(value.is_finite() && value > 0.0, "{line}");
            }
        }
        assert!(
            stdout.contains(&format!("bytes {store} 3k per-record ")),
            "{stdout}"
        );
        // The purger ran on its schedule and deleted expired records.
        let prefix = format!("purge {store} purged ");
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in\n{stdout}"));
        let purged: u64 = line[prefix.len()..]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a count");
        assert!(purged > 0, "{line}");
        assert!(
            stdout.contains(&format!("claim-p99 {store} no-purge ")),
            "{stdout}"
        );
    }
}
