//! The inbox under worker crashes: the webhooks demo's provider delivers
//! every event up to five times (resends racing the first delivery or
//! following it), the receiver enqueues each once, and the worker process
//! — a flaky, rate-limited handler whose effect commits with its record —
//! is killed with SIGKILL again and again. Every event must take effect
//! exactly once: none lost, none repeated.
//!
//! CI-sized by default (300 events, 5 kills); the full run is
//! `IDEM_FAULTS_INBOX_EVENTS=10000 IDEM_FAULTS_INBOX_KILLS=100`, over
//! SQLite, or PostgreSQL with `IDEM_FAULTS_INBOX_STORE=postgres://…`.

use std::path::PathBuf;
use std::time::Duration;

use idem_demo::{run_webhooks, InboxSpec, WebhooksConfig};

fn read(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn crash_run(inbox: &InboxSpec) {
    let mut config = WebhooksConfig::default();
    config.events = read("IDEM_FAULTS_INBOX_EVENTS", 300);
    config.chaos = read("IDEM_FAULTS_INBOX_KILLS", 5);
    config.max_deliveries = 5;
    config.poison = false;
    // Spread the kills over the run: about 40 events handled between two.
    config.kill_every = Duration::from_millis(150);
    config.give_up_after = Duration::from_secs(900);
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_inbox-worker"));
    let report = run_webhooks(exe, inbox, &config).await.expect("the run");
    println!("{report}");
    let events = config.events as u64;
    assert_eq!(report.duplicated_effects, 0, "an effect repeated\n{report}");
    assert_eq!(report.lost, 0, "an event was lost\n{report}");
    assert_eq!(report.effects, events, "{report}");
    assert_eq!(report.handled, events, "{report}");
    assert_eq!(report.enqueued, events, "{report}");
    assert_eq!(report.dead_lettered, 0, "{report}");
    assert!(report.deliveries > events, "nothing was resent\n{report}");
    assert_eq!(
        report.kills, config.chaos as u64,
        "the run ended before every kill landed\n{report}"
    );
    assert!(report.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_inbox_workers_lose_no_event_and_repeat_no_effect() {
    match std::env::var("IDEM_FAULTS_INBOX_STORE") {
        Ok(spec) => crash_run(&spec.parse().expect("sqlite:DIR or postgres://")).await,
        Err(_) => {
            let dir = tempfile::tempdir().unwrap();
            crash_run(&InboxSpec::Sqlite(dir.path().to_owned())).await;
        }
    }
}
