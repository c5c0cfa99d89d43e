//! How many generated schedules the interleaving suite plays, how many at
//! once and on what lease: [`Interleavings`].

use std::time::Duration;

/// Settings of the generated interleavings
/// (`interleaving::generated_schedules_keep_every_invariant` and
/// [`soak`](crate::soak)).
///
/// [`Interleavings::from_env`] reads them from the environment; the
/// `*_with` entry points ([`run_each_with`](crate::run_each_with),
/// [`run_all_with`](crate::run_all_with)) take them as an argument, and the
/// cases' timeouts scale with them.
///
/// | variable | default | meaning |
/// |---|---|---|
/// | `IDEM_SCHEDULES` (or `PROPTEST_CASES`) | 16 | schedules per run |
/// | `IDEM_SCHEDULES_AT_ONCE` | 4 | schedules played at once, each on its own key prefix |
/// | `IDEM_SCHEDULE_LEASE_MS` | 150 | the callers' lease; every time in a schedule scales with it |
/// | `PROPTEST_RNG_SEED` | from the clock | replays the schedules of a run |
/// | `PROPTEST_MAX_SHRINK_ITERS` | 16 | steps spent shrinking a failure |
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Interleavings {
    /// How many schedules to play.
    pub schedules: u32,
    /// How many schedules play at once, on one fixture, each under its own
    /// key prefix.
    pub at_once: usize,
    /// The lease every caller uses. Start times, work, stalls and
    /// cancellations are generated as fractions of it, so a shorter lease
    /// plays the same schedule faster; it must stay well above the store's
    /// clock resolution.
    pub lease: Duration,
    /// The seed the schedules are drawn from; `None` takes one from the
    /// clock.
    pub seed: Option<u64>,
    /// The most simplification steps spent shrinking a failure.
    pub shrink_iters: u32,
    /// The index of the first schedule to play: schedule `n` of a seed is
    /// the same whatever runs before it, so one failing schedule can be
    /// played again alone.
    pub first: u64,
}

/// The lease schedules are generated against; times scale from it.
pub(crate) const BASE_LEASE: Duration = Duration::from_millis(150);

/// Schedules per run when nothing is set: enough to catch a broken store,
/// few enough for CI.
pub const DEFAULT_SCHEDULES: u32 = 16;

/// Schedules played at once when nothing is set.
pub const DEFAULT_AT_ONCE: usize = 4;

/// How long past its schedules' share a run may take before it counts as
/// hung: a schedule plays in about a second at the default lease.
const PER_SCHEDULE: Duration = Duration::from_secs(2);

/// The floor for any case's timeout. Cases finish in seconds; only a store
/// that never answers reaches this.
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

impl Default for Interleavings {
    fn default() -> Interleavings {
        Interleavings {
            schedules: DEFAULT_SCHEDULES,
            at_once: DEFAULT_AT_ONCE,
            lease: BASE_LEASE,
            seed: None,
            shrink_iters: 16,
            first: 0,
        }
    }
}

impl Interleavings {
    /// The defaults, overridden by the environment variables in the table
    /// above. A variable that does not parse is ignored.
    pub fn from_env() -> Interleavings {
        let defaults = Interleavings::default();
        Interleavings {
            schedules: env("IDEM_SCHEDULES")
                .or_else(|| env("PROPTEST_CASES"))
                .map_or(defaults.schedules, |n| n.min(u64::from(u32::MAX)) as u32),
            at_once: env("IDEM_SCHEDULES_AT_ONCE").map_or(defaults.at_once, |n| n.max(1) as usize),
            lease: env("IDEM_SCHEDULE_LEASE_MS")
                .map_or(defaults.lease, |ms| Duration::from_millis(ms.max(1))),
            seed: env("PROPTEST_RNG_SEED"),
            shrink_iters: env("PROPTEST_MAX_SHRINK_ITERS")
                .map_or(defaults.shrink_iters, |n| n as u32),
            first: 0,
        }
    }

    /// With `schedules` schedules.
    pub fn with_schedules(mut self, schedules: u32) -> Interleavings {
        self.schedules = schedules;
        self
    }

    /// With `at_once` schedules at once (at least one).
    pub fn with_at_once(mut self, at_once: usize) -> Interleavings {
        self.at_once = at_once.max(1);
        self
    }

    /// With callers on `lease`.
    pub fn with_lease(mut self, lease: Duration) -> Interleavings {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// Starting at schedule `first` of the seed's sequence.
    pub fn with_first(mut self, first: u64) -> Interleavings {
        self.first = first;
        self
    }

    /// Drawn from `seed`.
    pub fn with_seed(mut self, seed: u64) -> Interleavings {
        self.seed = Some(seed);
        self
    }

    /// How long a case may run before it counts as hung: two minutes, or
    /// more when the schedules need it.
    pub fn case_timeout(&self) -> Duration {
        let batches = self.schedules.div_ceil(self.at_once.max(1) as u32);
        let scale = self.lease.as_secs_f64() / BASE_LEASE.as_secs_f64();
        CASE_TIMEOUT + PER_SCHEDULE.mul_f64(scale.max(1.0)) * batches
    }

    /// Time `n` in a schedule, generated in milliseconds against a 150 ms
    /// lease, scaled to this lease.
    pub(crate) fn at(&self, n: u16) -> Duration {
        Duration::from_millis(u64::from(n))
            .mul_f64(self.lease.as_secs_f64() / BASE_LEASE.as_secs_f64())
    }
}

tokio::task_local! {
    /// The settings of the run a case belongs to, when its entry point was
    /// given some.
    pub(crate) static SETTINGS: Interleavings;
}

/// The settings of the current run: those given to the entry point, or the
/// environment's.
pub(crate) fn current() -> Interleavings {
    SETTINGS
        .try_with(Clone::clone)
        .unwrap_or_else(|_| Interleavings::from_env())
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}
