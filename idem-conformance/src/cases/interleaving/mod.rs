//! Generated concurrent interleavings: schedules of callers racing over
//! shared and distinct keys, checked against invariants.

mod check;
mod play;
mod recorder;
mod schedule;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngSeed, TestRunner};
use tokio::time::Instant;

use crate::Factory;
use schedule::Schedule;

/// Schedules per run when `PROPTEST_CASES` is not set: enough to catch a
/// broken store, few enough for CI.
const DEFAULT_CASES: u32 = 16;

/// Shrinking steps when `PROPTEST_MAX_SHRINK_ITERS` is not set; each step
/// replays a schedule in real time.
const DEFAULT_SHRINK_ITERS: u32 = 16;

/// The longest shrinking may take before the smallest failure so far is
/// reported.
const SHRINK_TIME: Duration = Duration::from_secs(15);

/// Generated schedules of 2–8 callers over shared and distinct keys, with
/// equal and different bodies, work of varied length, cancelled callers and
/// owners stalled past their lease, keep every invariant: one owner per key
/// per lease, no stale token changes a record, every answer fits one
/// history, every outcome replays byte for byte, nothing is lost.
///
/// `PROPTEST_CASES` sets the number of schedules (default 16),
/// `PROPTEST_RNG_SEED` replays a run, `PROPTEST_MAX_SHRINK_ITERS` bounds
/// shrinking (default 16).
pub async fn generated_schedules_keep_every_invariant(factory: &dyn Factory) {
    let seed = env("PROPTEST_RNG_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
    });
    let cases = env("PROPTEST_CASES").map_or(DEFAULT_CASES, |n| n as u32);
    let shrink_iters = env("PROPTEST_MAX_SHRINK_ITERS").map_or(DEFAULT_SHRINK_ITERS, |n| n as u32);
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    });
    // Trees are drawn up front so the runner is not held across awaits.
    let strategy = schedule::schedules();
    let trees: Vec<_> = (0..cases)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .unwrap_or_else(|e| panic!("cannot generate a schedule: {e}"))
        })
        .collect();
    drop(runner);

    for (n, mut tree) in trees.into_iter().enumerate() {
        let violations = play::schedule(factory, &tree.current()).await;
        if violations.is_empty() {
            continue;
        }
        let (schedule, violations) = shrink(factory, &mut tree, violations, shrink_iters).await;
        panic!(
            "schedule {n} of {cases} broke the store's invariants (rerun with PROPTEST_RNG_SEED={seed}):\n  - {}\nsmallest failing schedule found: {schedule:#?}",
            violations.join("\n  - ")
        );
    }
}

/// Simplifies a failing schedule while it keeps failing, and returns the
/// smallest one found with its violations.
async fn shrink<T: ValueTree<Value = Schedule>>(
    factory: &dyn Factory,
    tree: &mut T,
    violations: Vec<String>,
    iters: u32,
) -> (Schedule, Vec<String>) {
    let mut smallest = (tree.current(), violations);
    let give_up = Instant::now() + SHRINK_TIME;
    let mut more = tree.simplify();
    let mut steps = 0;
    while more && steps < iters && Instant::now() < give_up {
        steps += 1;
        let candidate = tree.current();
        let violations = play::schedule(factory, &candidate).await;
        if violations.is_empty() {
            more = tree.complicate();
        } else {
            smallest = (candidate, violations);
            more = tree.simplify();
        }
    }
    smallest
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}
