//! Generated concurrent interleavings: schedules of callers racing over
//! shared and distinct keys, checked against invariants.

mod check;
mod play;
mod recorder;
mod schedule;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngSeed, TestRunner};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::settings::{self, Interleavings};
use crate::Factory;
use schedule::{Act, Schedule};

/// The longest shrinking may take before the smallest failure so far is
/// reported.
const SHRINK_TIME: Duration = Duration::from_secs(15);

/// Generated schedules of 2–8 callers over shared and distinct keys, with
/// equal and different bodies, work of varied length, cancelled callers and
/// owners stalled past their lease, keep every invariant: one owner per key
/// per lease, no stale token changes a record, every answer fits one
/// history, every outcome replays byte for byte, nothing is lost.
///
/// The number of schedules, how many play at once and their lease come
/// from the [`Interleavings`] given to the entry point, or from the
/// environment (`IDEM_SCHEDULES`, default 16; see [`Interleavings`]).
pub async fn generated_schedules_keep_every_invariant(factory: &dyn Factory) {
    let settings = settings::current();
    let soaked = soak(factory, &settings, |_| {}).await;
    if let Some(failure) = soaked.failure {
        panic!("{failure}");
    }
}

/// What a [`soak`] played and found.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Soak {
    /// The seed the schedules were drawn from.
    pub seed: u64,
    /// Schedules played to the end.
    pub schedules: u64,
    /// Callers in them.
    pub callers: u64,
    /// Callers dropped mid-call, as a crash would.
    pub crashes: u64,
    /// Owners that stalled past their lease without a heartbeat.
    pub stalls: u64,
    /// Times the work started.
    pub executions: u64,
    /// Schedules that broke an invariant (the run stops at the first).
    pub violations: u64,
    /// How long it took.
    pub elapsed: Duration,
    /// The first schedule that broke an invariant, shrunk.
    pub failure: Option<SoakFailure>,
}

/// A schedule that broke the store's invariants.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SoakFailure {
    /// The seed of the run; with the same settings it plays the same
    /// schedules in the same order.
    pub seed: u64,
    /// Which schedule of the run failed, from 0.
    pub index: u64,
    /// What broke when it first failed.
    pub first_violations: Vec<String>,
    /// What broke in the smallest failing schedule found.
    pub violations: Vec<String>,
    /// The smallest failing schedule found, as its callers.
    pub schedule: String,
}

impl fmt::Display for SoakFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "schedule {} broke the store's invariants (rerun with PROPTEST_RNG_SEED={}):\n  - {}\nthe smallest failing schedule found:\n  - {}\n{}",
            self.index,
            self.seed,
            self.first_violations.join("\n  - "),
            self.violations.join("\n  - "),
            self.schedule
        )
    }
}

/// Plays `settings.schedules` generated schedules against fixtures from
/// `factory`, `settings.at_once` at a time on one fixture under distinct key
/// prefixes, and calls `progress` after each batch. Stops at the first
/// schedule that breaks an invariant, shrinks it and returns it in
/// [`Soak::failure`].
pub async fn soak(
    factory: &dyn Factory,
    settings: &Interleavings,
    mut progress: impl FnMut(&Soak) + Send,
) -> Soak {
    let began = Instant::now();
    let seed = settings.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
    });
    let mut soaked = Soak {
        seed,
        ..Soak::default()
    };
    let total = settings.first + u64::from(settings.schedules);
    let at_once = settings.at_once.max(1) as u64;
    let mut next = settings.first;
    while next < total {
        let batch: Vec<u64> = (next..total.min(next + at_once)).collect();
        next += batch.len() as u64;
        let fixture = factory.fixture().await;
        let mut plays = JoinSet::new();
        for &index in &batch {
            let schedule = draw(seed, index).current();
            let (store, settings) = (fixture.store(), settings.clone());
            plays.spawn(async move {
                let name = format!("s{index}");
                let played = play::schedule(store, &schedule, &settings, &name).await;
                (index, schedule, played)
            });
        }
        let mut failed = None;
        while let Some(joined) = plays.join_next().await {
            let (index, schedule, played) = match joined {
                Ok(played) => played,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("a schedule was cancelled: {e}"),
            };
            soaked.schedules += 1;
            soaked.callers += schedule.callers.len() as u64;
            for caller in &schedule.callers {
                match caller.act {
                    Act::Cancel { .. } => soaked.crashes += 1,
                    Act::Stall { .. } => soaked.stalls += 1,
                    _ => {}
                }
            }
            soaked.executions += played.executions;
            if !played.violations.is_empty() {
                soaked.violations += 1;
                if failed.as_ref().is_none_or(|(first, _)| index < *first) {
                    failed = Some((index, played.violations));
                }
            }
        }
        drop(fixture);
        soaked.elapsed = began.elapsed();
        if let Some((index, violations)) = failed {
            let (schedule, shrunk) =
                shrink(factory, settings, seed, index, violations.clone()).await;
            soaked.failure = Some(SoakFailure {
                seed,
                index,
                first_violations: violations,
                violations: shrunk,
                schedule: format!("{schedule:#?}"),
            });
            soaked.elapsed = began.elapsed();
            progress(&soaked);
            return soaked;
        }
        progress(&soaked);
    }
    soaked
}

/// Schedule `index` of the run drawn from `seed`: each schedule has its own
/// generator, so any one of them can be drawn again alone.
fn draw(seed: u64, index: u64) -> impl ValueTree<Value = Schedule> + Send {
    let mut runner = TestRunner::new(Config {
        rng_seed: RngSeed::Fixed(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        failure_persistence: None,
        ..Config::default()
    });
    schedule::schedules()
        .new_tree(&mut runner)
        .unwrap_or_else(|e| panic!("cannot generate a schedule: {e}"))
}

/// Simplifies failing schedule `index` while it keeps failing, each try
/// alone on a fresh fixture, and returns the smallest one found with its
/// violations.
async fn shrink(
    factory: &dyn Factory,
    settings: &Interleavings,
    seed: u64,
    index: u64,
    violations: Vec<String>,
) -> (Schedule, Vec<String>) {
    let mut tree = draw(seed, index);
    let mut smallest = (tree.current(), violations);
    let give_up = Instant::now() + SHRINK_TIME.max(settings.lease * 100);
    let mut more = tree.simplify();
    let mut steps = 0;
    while more && steps < settings.shrink_iters && Instant::now() < give_up {
        steps += 1;
        let candidate = tree.current();
        let fixture = factory.fixture().await;
        // A name of its own: the factory may hand out the store the failing
        // run left its records in.
        let name = format!("s{index}-shrink-{steps}");
        let played = play::schedule(fixture.store(), &candidate, settings, &name).await;
        if played.violations.is_empty() {
            more = tree.complicate();
        } else {
            smallest = (candidate, played.violations);
            more = tree.simplify();
        }
    }
    smallest
}
