//! The inbox crash run's worker process: the webhooks demo's worker (its
//! flaky, rate-limited handler making each effect in the same transaction
//! as its record), started and killed by `tests/inbox_crash.rs`.
//!
//! Usage: `inbox-worker webhooks-worker --inbox SPEC --concurrency N`, the
//! arguments `idem_demo::run_webhooks` gives its worker child.

use std::process::ExitCode;
use std::str::FromStr;

use idem_demo::{run_webhooks_worker, InboxSpec};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|at| args.get(at + 1))
    };
    let inbox = match value("--inbox").map(|s| InboxSpec::from_str(s)) {
        Some(Ok(inbox)) => inbox,
        Some(Err(e)) => {
            eprintln!("inbox-worker: {e}");
            return ExitCode::from(2);
        }
        None => {
            eprintln!("usage: inbox-worker webhooks-worker --inbox SPEC --concurrency N");
            return ExitCode::from(2);
        }
    };
    let concurrency = value("--concurrency")
        .and_then(|n| n.parse().ok())
        .unwrap_or(8);
    // Killed with SIGKILL by the test; it never stops on its own.
    match run_webhooks_worker(&inbox, concurrency, std::future::pending()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inbox-worker: {e}");
            ExitCode::FAILURE
        }
    }
}
