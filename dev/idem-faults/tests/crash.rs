//! Worker processes killed with SIGKILL at random points, on each store:
//! while a lease is live no key runs twice, after it lapses exactly one
//! retry takes over, and every outcome a caller was told replays unchanged.
//!
//! Four `fault-worker` processes run `execute` on 400 shared keys; the
//! supervisor kills one at random every 75–300 ms, and each worker kills
//! itself with 1.5 % odds at four points (before the claim, mid-work, after
//! the work before recording, after recording). Every run writes `start`
//! and `done` lines to a ledger file. The checks: each key's recorded
//! outcome matches exactly one run, every other run belongs to a killed
//! worker, a key's second run starts only after the first run's worker died
//! and at least half a lease later, and every key settles once the leases
//! lapse.
//!
//! `IDEM_CRASH_TRIALS` (default 1) and `IDEM_CRASH_SECS` (default 4) raise
//! the work done.

use std::path::Path;
use std::time::Duration;

use idem_faults::crash::{self, Trial};
use idem_faults::{unique_name, Backend};
use idem_testing::{Isolation, StoreKind, TestStore};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn trial() -> Trial {
    Trial {
        workers: 4,
        keys: 400,
        lease: Duration::from_millis(1000),
        duration: Duration::from_secs(env_number("IDEM_CRASH_SECS", 4)),
        self_kill_per_mille: 15,
        max_kill_gap: Duration::from_millis(300),
    }
}

async fn trials(kind: StoreKind) {
    let exe = Path::new(env!("CARGO_BIN_EXE_fault-worker"));
    for n in 0..env_number("IDEM_CRASH_TRIALS", 1) {
        let dir = tempfile::tempdir().unwrap();
        // A shared store: a file every worker opens, or a prefix or table
        // on the server, removed when `_guard` drops.
        let (backend, _guard) = match kind.server() {
            None => (Backend::sqlite(dir.path().join("idem.db")), None),
            Some(server) => {
                let Some(url) = server.require() else { return };
                let scope = unique_name("crash");
                let guard = server.cleanup(&url, kind.isolation(), &scope);
                (Backend::new(kind, url, scope), Some(guard))
            }
        };
        let outcome = crash::run(exe, &backend, &trial(), dir.path())
            .await
            .unwrap_or_else(|broken| panic!("{} trial {n}: {broken}", backend.name()));
        println!("{} trial {n}: {outcome:?}", backend.name());
        assert!(
            outcome.killed + outcome.self_killed > 0,
            "nothing was killed: {outcome:?}"
        );
        assert!(
            outcome.told > 0 && outcome.runs > 0,
            "no work was done: {outcome:?}"
        );
        assert_eq!(outcome.keys_completed, trial().keys as usize);
    }
}

/// Every store whose records outlive a process (all but memory), its trials
/// run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_survives_workers_killed_at_random_points() {
    let mut runs = tokio::task::JoinSet::new();
    for kind in StoreKind::ALL {
        if kind.isolation() != Isolation::Process {
            runs.spawn(trials(kind));
        }
    }
    while let Some(run) = runs.join_next().await {
        if let Err(failed) = run {
            std::panic::resume_unwind(failed.into_panic());
        }
    }
}
