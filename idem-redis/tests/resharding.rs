//! Slots that hold live records moved to another master in the middle of a
//! storm of calls, as `redis-cli --cluster reshard` moves them
//! (`idem_testing::reshard`): no key runs twice, every outcome a caller was
//! told replays afterwards, and every error a caller sees says truly
//! whether the work ran.
//!
//! The cluster is this test's own: three masters, no replicas, so nothing
//! but the moves can lose a write. Most keys carry a hash tag that puts
//! them in one of the moving slots; the rest spread over the cluster.
//! Each caller runs fresh keys one after another, retries a key after a
//! store error until it is told the outcome, and after each key replays
//! one it was told before. Each slot moves a few keys at a time, and the
//! mover waits for the callers to act on the half-moved slot between
//! batches: claims, outcomes and replays meet `ASK` on the source and
//! `ASKING` on the target, and, once the move is done, `MOVED`.
//! `IDEM_RESHARD_TRIALS` (default 1) sets the storms a run.

#[allow(dead_code)]
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{Error, Idempotent, When};
use idem_redis::RedisStore;
use idem_testing::reshard::{self, Master};
use support::servers::{self, Servers};

/// The hash tags of the keys in moving slots.
const TAGS: [&str; 3] = ["reshard-a", "reshard-b", "reshard-c"];
/// Times each tagged slot moves in a storm, each time to the next master.
const ROUNDS: usize = 2;
/// Keys a `MIGRATE` carries.
const BATCH: usize = 4;
/// Concurrent callers.
const CALLERS: usize = 12;

/// What one storm saw.
#[derive(Debug, Default, Clone)]
struct Figures {
    /// Keys the callers started, and those of them in moving slots.
    keys: usize,
    keys_in_moving_slots: usize,
    /// Calls made: first tries, retries and replays.
    calls: usize,
    /// Runs of the work, and runs beyond a key's first.
    executions: usize,
    second_runs: usize,
    /// Keys whose outcome a caller was told.
    told: usize,
    /// Replays during the storm, and those that ran the work or answered
    /// another outcome.
    replays: usize,
    wrong_replays: usize,
    /// Told outcomes that did not replay after the storm.
    lost_outcomes: usize,
    /// Store errors by their `When`, and those whose `When` was false:
    /// `BeforeWork` from a call that ran the work, `AfterWork` from one
    /// that did not.
    errors_before_work: usize,
    errors_after_work: usize,
    wrong_when: usize,
    /// Store errors by what they say, the digits left out.
    error_kinds: std::collections::BTreeMap<String, usize>,
    /// Keys left because another call held them, or told `LeaseLost`.
    in_flight: usize,
    leases_lost: usize,
    /// Slot moves, the keys they carried and their `MIGRATE`s.
    migrations: usize,
    keys_migrated: usize,
    batches: usize,
}

#[derive(Debug, Default)]
struct Ledger {
    stop: AtomicBool,
    /// Calls on keys in moving slots that returned, whatever they returned:
    /// the mover waits on it between batches.
    moving_calls: AtomicUsize,
    runs: Mutex<HashMap<String, usize>>,
    told: Mutex<HashMap<String, String>>,
    figures: Mutex<Figures>,
}

/// One call of `key`; `Some(outcome)` when told one. Counts everything.
async fn call(idem: &Idempotent, ledger: &Arc<Ledger>, key: &str) -> Result<String, Error<String>> {
    let ran = Arc::new(AtomicBool::new(false));
    let (ran_here, runs, run_key) = (ran.clone(), ledger.clone(), key.to_owned());
    let out = idem
        .execute(key, key, || async move {
            ran_here.store(true, Ordering::SeqCst);
            *runs
                .runs
                .lock()
                .unwrap()
                .entry(run_key.clone())
                .or_default() += 1;
            // The claim stays in flight a moment, so moves carry claims too.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(format!("outcome of {run_key}"))
        })
        .await;
    if key.starts_with('{') {
        ledger.moving_calls.fetch_add(1, Ordering::SeqCst);
    }
    let mut figures = ledger.figures.lock().unwrap();
    figures.calls += 1;
    if let Err(error @ Error::Store { when, .. }) = &out {
        let kind = format!(
            "{when:?}: {}",
            std::error::Error::source(error).map_or(String::new(), |e| format!("{e}"))
        )
        .replace(|c: char| c.is_ascii_digit(), "");
        *figures.error_kinds.entry(kind).or_default() += 1;
        let before = *when == When::BeforeWork;
        if before {
            figures.errors_before_work += 1;
        } else {
            figures.errors_after_work += 1;
        }
        if before == ran.load(Ordering::SeqCst) {
            figures.wrong_when += 1;
        }
    }
    out
}

/// A caller: fresh keys one after another, each retried after a store
/// error until told, then one earlier key replayed.
async fn caller(idem: Idempotent, caller: usize, ledger: Arc<Ledger>) {
    let mut mine: Vec<String> = Vec::new();
    let mut n = 0usize;
    while !ledger.stop.load(Ordering::SeqCst) {
        n += 1;
        // Three keys in four in a moving slot.
        let key = if n % 4 == 0 {
            format!("c{caller}-{n}")
        } else {
            format!("{{{}}}c{caller}-{n}", TAGS[(caller + n) % TAGS.len()])
        };
        {
            let mut figures = ledger.figures.lock().unwrap();
            figures.keys += 1;
            figures.keys_in_moving_slots += usize::from(key.starts_with('{'));
        }
        loop {
            match call(&idem, &ledger, &key).await {
                Ok(outcome) => {
                    ledger.told.lock().unwrap().insert(key.clone(), outcome);
                    mine.push(key.clone());
                    break;
                }
                Err(Error::Store { .. }) => {}
                Err(Error::InProgress { .. }) => {
                    ledger.figures.lock().unwrap().in_flight += 1;
                    break;
                }
                Err(Error::LeaseLost) => {
                    ledger.figures.lock().unwrap().leases_lost += 1;
                    break;
                }
                Err(other) => panic!("{key}: {other}"),
            }
            if ledger.stop.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A retry of a told key, picked by a fixed stride through them.
        if let Some(old) = mine.get(n.wrapping_mul(7919) % mine.len().max(1)).cloned() {
            let told = ledger.told.lock().unwrap().get(&old).cloned();
            let runs_before = runs_of(&ledger, &old);
            let replay = call(&idem, &ledger, &old).await;
            let mut figures = ledger.figures.lock().unwrap();
            figures.replays += 1;
            // A store error is counted above; the final replay checks it.
            let wrong = match &replay {
                Ok(outcome) => Some(outcome) != told.as_ref(),
                Err(Error::Store { .. }) => false,
                Err(_) => true,
            };
            if wrong || runs_of(&ledger, &old) != runs_before {
                figures.wrong_replays += 1;
            }
        }
    }
}

fn runs_of(ledger: &Ledger, key: &str) -> usize {
    ledger.runs.lock().unwrap().get(key).copied().unwrap_or(0)
}

/// Polls until `count` passes `at_least`, or fails after 30 s saying `what`.
fn wait_for(count: impl Fn() -> usize, at_least: usize, what: &str) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while count() < at_least {
        assert!(
            Instant::now() < give_up,
            "{what}: {} of {at_least}",
            count()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

async fn storm() -> Option<Figures> {
    if let Some(reason) = servers::binaries_missing() {
        return support::skip(&reason);
    }
    let cluster = Servers::cluster(3).unwrap_or_else(|e| panic!("cannot start a cluster: {e}"));
    let first = cluster.ports()[0];
    let masters = reshard::masters(first).unwrap();
    assert_eq!(masters.len(), 3, "{masters:?}");
    let store = RedisStore::connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster")
        .with_prefix(support::unique_prefix());
    // The slots the tags put records in, found by the server.
    let mut slots: Vec<u16> = TAGS
        .iter()
        .map(|tag| {
            let key = idem_core::Key::new("", "", &format!("{{{tag}}}x")).unwrap();
            reshard::key_slot(first, &store.redis_key(key.as_str())).unwrap()
        })
        .collect();
    slots.sort_unstable();
    slots.dedup();
    // Every second run here would be one under a live lease.
    let idem = Idempotent::new(store).with_lease(Duration::from_secs(120));
    let ledger = Arc::new(Ledger::default());
    let callers: Vec<_> = (0..CALLERS)
        .map(|n| tokio::spawn(caller(idem.clone(), n, ledger.clone())))
        .collect();

    let mut figures = tokio::task::block_in_place(|| {
        let mut moves = Figures::default();
        for _ in 0..ROUNDS {
            for &slot in &slots {
                let from = reshard::owner(&masters, slot).unwrap();
                let to = next(&masters, &from);
                // The slot holds live records before it moves.
                wait_for(
                    || reshard::keys_in_slot(from.port, slot).unwrap(),
                    3 * BATCH,
                    &format!("records in slot {slot}"),
                );
                let moved = reshard::move_slot(&masters, slot, &from, &to, BATCH, || {
                    let calls = ledger.moving_calls.load(Ordering::SeqCst);
                    wait_for(
                        || ledger.moving_calls.load(Ordering::SeqCst),
                        calls + CALLERS,
                        &format!("calls while slot {slot} moved"),
                    );
                })
                .unwrap_or_else(|e| panic!("moving slot {slot}: {e}"));
                moves.migrations += 1;
                moves.keys_migrated += moved.keys;
                moves.batches += moved.batches;
            }
        }
        // Calls after the last move, on the moved slots' new owners.
        let calls = ledger.moving_calls.load(Ordering::SeqCst);
        wait_for(
            || ledger.moving_calls.load(Ordering::SeqCst),
            calls + 4 * CALLERS,
            "calls after the moves",
        );
        moves
    });
    ledger.stop.store(true, Ordering::SeqCst);
    for caller in callers {
        caller.await.expect("a caller of the storm failed");
    }

    let counted = ledger.figures.lock().unwrap().clone();
    let runs = ledger.runs.lock().unwrap().clone();
    let told = ledger.told.lock().unwrap().clone();
    figures = Figures {
        migrations: figures.migrations,
        keys_migrated: figures.keys_migrated,
        batches: figures.batches,
        executions: runs.values().sum(),
        second_runs: runs.values().map(|runs| runs - 1).sum(),
        told: told.len(),
        ..counted
    };
    // Every told outcome replays, and runs nothing, after the moves.
    for (key, outcome) in &told {
        let ran = AtomicBool::new(false);
        let replay = idem
            .execute(key, key, || async {
                ran.store(true, Ordering::SeqCst);
                Ok::<_, String>("run again".to_owned())
            })
            .await;
        if ran.load(Ordering::SeqCst) || replay.as_ref().ok() != Some(outcome) {
            figures.lost_outcomes += 1;
        }
    }
    Some(figures)
}

/// The master after `from`, by port, round.
fn next(masters: &[Master], from: &Master) -> Master {
    let at = masters.iter().position(|m| m == from).unwrap();
    masters[(at + 1) % masters.len()].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_moved_mid_storm_run_nothing_twice_lose_no_outcome_and_tell_errors_truly() {
    let trials = std::env::var("IDEM_RESHARD_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for trial in 1..=trials {
        let Some(f) = storm().await else {
            return;
        };
        eprintln!("resharding, trial {trial}: {f:?}");
        assert_eq!(f.migrations, ROUNDS * TAGS.len(), "{f:?}");
        assert!(
            f.keys_migrated > 0 && f.told > 300,
            "too little happened: {f:?}"
        );
        assert_eq!(f.second_runs, 0, "a key ran twice: {f:?}");
        assert!(f.executions >= f.told, "a told outcome never ran: {f:?}");
        assert_eq!(f.lost_outcomes, 0, "a told outcome was lost: {f:?}");
        assert_eq!(
            f.wrong_replays, 0,
            "a replay ran the work or answered wrongly: {f:?}"
        );
        assert_eq!(f.wrong_when, 0, "an error said the wrong thing: {f:?}");
    }
}
