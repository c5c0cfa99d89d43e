//! Each binary of the harness runs end to end in its quick mode, and
//! `--markdown` rewrites only its tables. Speed is not asserted: CI
//! machines vary.

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idem-bench"))
}

fn inbox() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inbox-bench"))
}

fn scale() -> Command {
    Command::new(env!("CARGO_BIN_EXE_scale-bench"))
}

fn wake() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wake-bench"))
}

fn serve() -> Command {
    Command::new(env!("CARGO_BIN_EXE_serve-bench"))
}

fn stream() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stream-bench"))
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
    let output = inbox().arg("--quick").output().expect("the harness starts");
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
    let output = scale()
        .args(["--quick", "--stores", "memory,sqlite"])
        .args(["--sizes", "300,3k", "--duration", "30ms", "--reps", "1"])
        .args(["--rate", "200", "--retention", "300ms"])
        .args(["--purge-every", "50ms", "--window", "400ms"])
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

/// A card with the markers of every section, prose around them that must
/// survive byte for byte (odd spacing, a CRLF line, no final newline).
fn card() -> String {
    let mut card = String::from("# Card\r\n\nProse   with *spaces*.\n\n");
    for section in ["results", "http", "wake", "scale", "streams"] {
        card.push_str(&format!(
            "<!-- BEGIN idem-bench {section} -->\nstale {section}\n<!-- END idem-bench {section} -->\n\nbetween {section}\n"
        ));
    }
    card.push_str("tail");
    card
}

/// What lies outside `section`'s markers.
fn outside<'a>(text: &'a str, section: &str) -> (&'a str, &'a str) {
    let begin = format!("<!-- BEGIN idem-bench {section} -->\n");
    let end = format!("<!-- END idem-bench {section} -->");
    let from = text.find(&begin).expect("the begin marker stays") + begin.len();
    let to = text.find(&end).expect("the end marker stays");
    (&text[..from], &text[to..])
}

#[test]
fn markdown_rewrites_the_results_table_and_nothing_else() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("BENCHMARKS.md");
    let before = card();
    std::fs::write(&path, &before).expect("the card is written");
    let output = bench()
        .args(["--quick", "--stores", "memory", "--duration", "20ms"])
        .args(["--reps", "1", "--replay-keys", "10", "--markdown"])
        .arg(&path)
        .output()
        .expect("the harness starts");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let after = std::fs::read_to_string(&path).expect("the card is read");
    assert_eq!(outside(&after, "results"), outside(&before, "results"));
    let (_, rest) = outside(&after, "results");
    let table = &after[outside(&after, "results").0.len()..after.len() - rest.len()];
    let lines: Vec<&str> = table.lines().collect();
    // A header, its rule, and a line per workload and concurrency.
    assert_eq!(lines.len(), 2 + 3 * 2, "{table}");
    assert!(lines[0].starts_with("| store | workload | callers | idem ops/s | raw ops/s |"));
    for workload in ["first", "replay", "contended"] {
        for callers in ["1", "32"] {
            let prefix = format!("| memory | {workload} | {callers} | ");
            assert!(
                lines.iter().any(|l| l.starts_with(&prefix)),
                "{prefix} in\n{table}"
            );
        }
    }
    // The HTTP table was not measured, so it was left as it was.
    assert!(after.contains("stale http"));
}

#[test]
fn markdown_refuses_a_file_without_markers_and_leaves_it_alone() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("card.md");
    std::fs::write(&path, "no markers here\n").expect("the card is written");
    let output = wake()
        .args([
            "--quick",
            "--stores",
            "memory",
            "--trials",
            "3",
            "--markdown",
        ])
        .arg(&path)
        .output()
        .expect("the harness starts");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("<!-- BEGIN idem-bench wake -->"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "no markers here\n");
}

#[test]
fn wake_quick_mode_writes_its_table_between_its_markers() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("BENCHMARKS.md");
    let before = card();
    std::fs::write(&path, &before).expect("the card is written");
    let output = wake()
        .args([
            "--quick",
            "--stores",
            "memory,sqlite",
            "--trials",
            "5",
            "--markdown",
        ])
        .arg(&path)
        .output()
        .expect("the harness starts");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let after = std::fs::read_to_string(&path).expect("the card is read");
    assert_eq!(outside(&after, "wake"), outside(&before, "wake"));
    assert!(after.contains("| memory | "), "{after}");
    assert!(after.contains("| sqlite | "), "{after}");
}

#[test]
fn stream_quick_mode_writes_the_table_it_prints_between_its_markers() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("BENCHMARKS.md");
    let before = card();
    std::fs::write(&path, &before).expect("the card is written");
    let output = stream()
        .args(["--quick", "--stores", "sqlite", "--markdown"])
        .arg(&path)
        .output()
        .expect("the harness starts");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).expect("the table is UTF-8");
    let after = std::fs::read_to_string(&path).expect("the card is read");
    assert_eq!(outside(&after, "streams"), outside(&before, "streams"));
    let (head, tail) = outside(&after, "streams");
    let written = &after[head.len()..after.len() - tail.len()];
    // The file holds what the run printed, and the table has its row.
    assert_eq!(written, printed);
    assert!(
        written.starts_with("| store | body | first: s, RSS + MiB |"),
        "{written}"
    );
    assert!(written.contains("\n| sqlite | 4 MiB | "), "{written}");
    assert!(after.contains("stale results"));
}

#[test]
fn serve_quick_mode_answers_and_replays_on_every_server() {
    let output = serve()
        .args(["memory", "--quick"])
        .output()
        .expect("the harness starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for name in ["axum-idem", "axum-control", "actix-idem", "actix-control"] {
        assert!(
            stdout.contains(&format!("checked {name} request 1: 201 Created")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("checked axum-idem request 1: 201 Created, replayed true"));
}
