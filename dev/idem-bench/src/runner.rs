//! Timed runs: many callers driving one protocol over a workload's keys.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::task::JoinSet;

use crate::fixture::BoxError;
use crate::stats::Summary;

/// What one operation amounted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The key was claimed, the work ran and its outcome was recorded.
    Ran,
    /// A recorded outcome was found and returned.
    Replayed,
    /// Another caller held the key.
    InProgress,
}

/// One way of making a call idempotent: the raw protocol, a recipe, or idem.
#[async_trait]
pub(crate) trait Protocol: Send + Sync + 'static {
    /// One idempotent call under `key`: claim it and, if the claim is ours,
    /// run the trivial work and record its 100-byte outcome.
    async fn op(&self, key: &str) -> Result<Outcome, BoxError>;
}

/// Which keys the calls use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Workload {
    /// Every call on a key never used before: a claim and a completion.
    First,
    /// Every call on a key completed beforehand: a replay.
    Replay,
    /// Groups of [`CONTENDED_CALLERS`] calls on one key: one runs, the
    /// others find it in progress or replay it.
    Contended,
}

/// How many calls share one key in the contended workload.
pub(crate) const CONTENDED_CALLERS: u64 = 32;

impl Workload {
    pub(crate) const ALL: [Workload; 3] = [Workload::First, Workload::Replay, Workload::Contended];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::First => "first",
            Workload::Replay => "replay",
            Workload::Contended => "contended",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// The key sequence of one row in one workload.
#[derive(Debug)]
pub(crate) struct Keys {
    prefix: String,
    workload: Workload,
    pool: u64,
    next: AtomicU64,
}

impl Keys {
    /// Keys under `prefix`; replays cycle through `pool` keys, which
    /// [`prepare`] completes first.
    pub(crate) fn new(prefix: String, workload: Workload, pool: u64) -> Keys {
        Keys {
            prefix,
            workload,
            pool: pool.max(1),
            next: AtomicU64::new(0),
        }
    }

    pub(crate) fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        match self.workload {
            Workload::First => format!("{}f{n}", self.prefix),
            Workload::Replay => format!("{}r{}", self.prefix, n % self.pool),
            Workload::Contended => format!("{}c{}", self.prefix, n / CONTENDED_CALLERS),
        }
    }

    /// Every key the replay workload will use.
    fn pool_keys(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.pool).map(|n| format!("{}r{n}", self.prefix))
    }
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// After this much wall time.
    Time(Duration),
    /// After this many operations in all.
    Ops(u64),
}

/// How the operations of a run came out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) ran: u64,
    pub(crate) replayed: u64,
    pub(crate) in_progress: u64,
    pub(crate) errors: u64,
}

impl Tally {
    fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Ran => self.ran += 1,
            Outcome::Replayed => self.replayed += 1,
            Outcome::InProgress => self.in_progress += 1,
        }
    }

    pub(crate) fn add(&mut self, other: Tally) {
        self.ran += other.ran;
        self.replayed += other.replayed;
        self.in_progress += other.in_progress;
        self.errors += other.errors;
    }

    /// Operations that completed without an error.
    pub(crate) fn ok(&self) -> u64 {
        self.ran + self.replayed + self.in_progress
    }
}

/// What one timed run measured.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) summary: Summary,
    pub(crate) tally: Tally,
    pub(crate) first_error: Option<String>,
    /// CPU time this whole process spent during the run (every thread: the
    /// callers, the drivers, an in-process store or server), if known.
    pub(crate) cpu: Option<Duration>,
}

/// CPU time this process has used so far, from `/proc/self/stat` (Linux;
/// `None` elsewhere). Ticks are 10 ms, fine over runs of a second or more.
pub(crate) fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is the first, utime the 12th, stime the 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    // USER_HZ is 100 on every Linux the harness runs on.
    Some(Duration::from_millis((user + system) * 10))
}

/// Runs `protocol` from `concurrency` callers until `limit`, each caller
/// timing every operation it makes. Key formatting is outside the timing.
pub(crate) async fn run(
    protocol: Arc<dyn Protocol>,
    keys: Arc<Keys>,
    concurrency: usize,
    limit: Limit,
) -> Run {
    let budget = Arc::new(AtomicU64::new(match limit {
        Limit::Ops(n) => n,
        Limit::Time(_) => u64::MAX,
    }));
    let cpu_before = process_cpu();
    let start = Instant::now();
    let deadline = match limit {
        Limit::Time(d) => Some(start + d),
        Limit::Ops(_) => None,
    };
    let mut callers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (protocol, keys, budget) = (protocol.clone(), keys.clone(), budget.clone());
        callers.spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 12);
            let mut tally = Tally::default();
            let mut first_error = None;
            while take_one(&budget) {
                let key = keys.next();
                let began = Instant::now();
                let result = protocol.op(&key).await;
                let ended = Instant::now();
                match result {
                    Ok(outcome) => {
                        tally.count(outcome);
                        latencies
                            .push(u64::try_from((ended - began).as_nanos()).unwrap_or(u64::MAX));
                    }
                    Err(error) => {
                        tally.errors += 1;
                        first_error.get_or_insert_with(|| error.to_string());
                    }
                }
                if deadline.is_some_and(|d| ended >= d) {
                    break;
                }
            }
            (latencies, tally, first_error)
        });
    }
    let mut latencies = Vec::new();
    let mut tally = Tally::default();
    let mut first_error = None;
    while let Some(joined) = callers.join_next().await {
        match joined {
            Ok((lat, t, e)) => {
                latencies.extend(lat);
                tally.add(t);
                first_error = first_error.or(e);
            }
            Err(panic) => {
                tally.errors += 1;
                first_error.get_or_insert_with(|| format!("a caller panicked: {panic}"));
            }
        }
    }
    let elapsed = start.elapsed();
    let cpu = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    Run {
        summary: Summary::of(tally.ok(), elapsed, &mut latencies),
        tally,
        first_error,
        cpu,
    }
}

fn take_one(budget: &AtomicU64) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
        .is_ok()
}

/// Completes every key of the replay pool, 32 at a time.
pub(crate) async fn prepare(protocol: &Arc<dyn Protocol>, keys: &Keys) -> Result<(), BoxError> {
    let all: Vec<String> = keys.pool_keys().collect();
    for chunk in all.chunks(32) {
        let mut set = JoinSet::new();
        for key in chunk {
            let (protocol, key) = (protocol.clone(), key.clone());
            set.spawn(async move { protocol.op(&key).await });
        }
        while let Some(joined) = set.join_next().await {
            joined.map_err(|e| format!("preparing replays: {e}"))??;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Pins: the reading grows with the work this process does. It spun for
    // 60 ms of wall time and asked for 20 ms of CPU, which a loaded machine
    // need not give it in that time; it now spins until the reading grows,
    // bounded by a wall time no machine takes.
    #[test]
    fn process_cpu_grows_with_work_on_linux() {
        let Some(before) = process_cpu() else {
            return;
        };
        let give_up = Instant::now() + Duration::from_secs(30);
        let mut spin = 0u64;
        loop {
            for _ in 0..100_000 {
                spin = std::hint::black_box(spin.wrapping_add(1));
            }
            let now = process_cpu().expect("read once, readable again");
            if now >= before + Duration::from_millis(20) {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "30 s of spinning moved the process's CPU time from {before:?} to {now:?} only"
            );
        }
    }

    #[test]
    fn contended_keys_change_every_thirty_two_calls() {
        let keys = Keys::new("p.".to_owned(), Workload::Contended, 1);
        let names: Vec<String> = (0..65).map(|_| keys.next()).collect();
        assert!(names[..32].iter().all(|k| k == "p.c0"));
        assert!(names[32..64].iter().all(|k| k == "p.c1"));
        assert_eq!(names[64], "p.c2");
    }

    #[test]
    fn replay_keys_cycle_through_the_pool() {
        let keys = Keys::new("p.".to_owned(), Workload::Replay, 2);
        let names: Vec<String> = (0..3).map(|_| keys.next()).collect();
        assert_eq!(names, ["p.r0", "p.r1", "p.r0"]);
        assert_eq!(keys.pool_keys().collect::<Vec<_>>(), ["p.r0", "p.r1"]);
    }
}
