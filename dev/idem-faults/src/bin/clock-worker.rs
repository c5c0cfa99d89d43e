//! A worker process for the clock test, run with its clock skewed: prints
//! its own clock, then calls `execute` on one key until it is told an
//! outcome. The work prints `ran`, sleeps, and returns the worker's name;
//! a call refused because the key is in flight prints `busy` and is tried
//! again 50 ms later.
//!
//! Usage: `clock-worker NAME KEY LEASE_MS WORK_MS BACKEND...`
//! (`WORK_MS` 0: the work never ends). Lines out: `clock MS` (the
//! process's Unix time in milliseconds), `busy`, `ran`, `told OUTCOME`,
//! `error ERROR`.

use std::io::{BufRead, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::{Error, Idempotent};
use idem_faults::Backend;

fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(name), Some(key), Some(lease), Some(work), Some(backend)) = (
        args.first().cloned(),
        args.get(1).cloned(),
        args.get(2).and_then(|l| l.parse::<u64>().ok()),
        args.get(3).and_then(|w| w.parse::<u64>().ok()),
        args.get(4..).and_then(Backend::from_args),
    ) else {
        eprintln!("usage: clock-worker NAME KEY LEASE_MS WORK_MS BACKEND...");
        std::process::exit(2);
    };
    // A worker whose test is gone must not run on: it exits when its stdin
    // closes.
    std::thread::spawn(|| {
        for _ in std::io::stdin().lock().lines() {}
        std::process::exit(0);
    });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    say(&format!("clock {now}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let store = match backend.open().await {
            Ok(store) => store,
            Err(error) => {
                say(&format!("error {error}"));
                std::process::exit(3);
            }
        };
        let idem = Idempotent::from_arc(store).with_lease(Duration::from_millis(lease));
        loop {
            let outcome: Result<String, Error<String>> = idem
                .execute(&key, &key, || async {
                    say("ran");
                    if work == 0 {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_millis(work)).await;
                    Ok(name.clone())
                })
                .await;
            match outcome {
                Ok(outcome) => {
                    say(&format!("told {outcome}"));
                    return;
                }
                Err(Error::InProgress { .. }) => say("busy"),
                Err(error) => {
                    say(&format!("error {error}"));
                    std::process::exit(1);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}
