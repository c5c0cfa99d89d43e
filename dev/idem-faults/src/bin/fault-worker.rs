//! A worker process for the crash tests: runs `execute` on shared keys in a
//! loop, writes every run's side effect to the ledger, prints every outcome
//! it was told was recorded, and may kill itself with SIGKILL at chosen
//! points.
//!
//! Usage: `fault-worker WORKER KEYS LEASE_MS LEDGER KILL_PER_MILLE BACKEND...`

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use idem_core::{Error, Idempotent};
use idem_faults::ledger::{now_ms, Event, EventKind, Ledger};
use idem_faults::Backend;
use rand::Rng;

struct Worker {
    id: String,
    ledger: Ledger,
    kill_per_mille: u32,
}

impl Worker {
    /// With probability `kill_per_mille`/1000, notes the point in the ledger
    /// and dies by SIGKILL, as a crash would: no destructor runs.
    fn maybe_die(&self, point: &str) {
        if rand::rng().random_range(0..1000) >= self.kill_per_mille {
            return;
        }
        let _ = self.ledger.append(&Event {
            kind: EventKind::Kill,
            key: point.to_owned(),
            worker: self.id.clone(),
            nonce: "-".into(),
            at_ms: now_ms(),
        });
        let _ = Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        std::thread::sleep(Duration::from_secs(3600));
    }

    fn event(&self, kind: EventKind, key: &str, nonce: &str) {
        let event = Event {
            kind,
            key: key.to_owned(),
            worker: self.id.clone(),
            nonce: nonce.to_owned(),
            at_ms: now_ms(),
        };
        self.ledger
            .append(&event)
            .expect("the ledger must be writable");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: fault-worker WORKER KEYS LEASE_MS LEDGER KILL_PER_MILLE BACKEND...";
    let (Some(id), Some(keys), Some(lease), Some(ledger), Some(kill), Some(backend)) = (
        args.first(),
        args.get(1).and_then(|k| k.parse::<u32>().ok()),
        args.get(2).and_then(|l| l.parse::<u64>().ok()),
        args.get(3),
        args.get(4).and_then(|k| k.parse::<u32>().ok()),
        args.get(5..).and_then(Backend::from_args),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    // A worker whose supervisor is gone must not run on: it watches its
    // stdin and exits when the pipe closes.
    std::thread::spawn(|| {
        for _ in std::io::stdin().lock().lines() {}
        std::process::exit(0);
    });
    let worker = Worker {
        id: id.clone(),
        ledger: Ledger::open(&PathBuf::from(ledger)).expect("the ledger must open"),
        kill_per_mille: kill,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(worker, keys, Duration::from_millis(lease), backend));
}

async fn run(worker: Worker, keys: u32, lease: Duration, backend: Backend) {
    let store = match backend.open().await {
        Ok(store) => store,
        Err(error) => {
            eprintln!("fault-worker: cannot open {}: {error}", backend.name());
            std::process::exit(3);
        }
    };
    let idem = Idempotent::from_arc(store).with_lease(lease);
    let mut stdout = std::io::stdout();
    loop {
        let key = format!("key-{}", rand::rng().random_range(0..keys));
        worker.maybe_die("before-claim");
        let body = serde_json::json!({ "key": key });
        let outcome: Result<String, Error<String>> = idem
            .execute(&key, &body, || async {
                let nonce = format!("{:016x}", rand::random::<u64>());
                worker.event(EventKind::Start, &key, &nonce);
                worker.maybe_die("mid-work");
                let pause = rand::rng().random_range(2..30);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                worker.event(EventKind::Done, &key, &nonce);
                worker.maybe_die("after-work");
                Ok(nonce)
            })
            .await;
        match outcome {
            Ok(value) => {
                worker.maybe_die("after-complete");
                let _ = writeln!(stdout, "recorded {key} {value}");
            }
            Err(Error::InProgress { .. }) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(error) => {
                let _ = writeln!(stdout, "error {key} {error}");
            }
        }
        let _ = stdout.flush();
    }
}
