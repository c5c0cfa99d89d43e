//! One store's rows, measured side by side: raw and idem runs alternate
//! within each repetition so that machine noise hits both alike.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::fixture::BoxError;
use crate::report::{Report, Row};
use crate::runner::{self, Keys, Limit, Protocol, Tally, Workload};
use crate::stats::{self, Summary};

/// A server's cumulative counters (Redis commands by name, PostgreSQL
/// transactions), read before and after every timed run.
pub(crate) type Counters = BTreeMap<String, u64>;

/// Which protocol a row runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    /// The minimal correct protocol, by hand: one-round-trip claim, one
    /// compare-and-set completion.
    Raw,
    /// The common blog recipe (Redis only): SET NX, GET on a duplicate,
    /// plain SET to complete. Unfenced; a reference, not a contender.
    Blog,
    /// The raw protocol with one transaction per operation (SQLite only):
    /// what group commit is measured against.
    Single,
    /// The raw protocol whose claim also reads the key's time to live in
    /// the same `MULTI … EXEC` (Redis only): what a claim would pay on
    /// every call to report the time left on the server's clock in one
    /// round trip. idem-redis reads it only for a record found in flight.
    Timed,
    /// The HTTP control: the same app without the layer, its handler making
    /// one plain store round trip. The HTTP rows' baseline.
    Control,
    /// idem's `execute` over the store crate.
    Idem,
    /// The raw protocol with the effect in the same transaction (PostgreSQL
    /// only): the bare claim, then one transaction holding a business
    /// insert and the token-conditioned completion.
    RawTx,
    /// idem's `execute_in_tx` doing the same: measured against `raw-tx`.
    IdemTx,
    /// idem's `execute_steps` with three trivial steps: what durable steps
    /// cost next to `idem` (one store round trip per recorded step). Its
    /// ratio, in brackets, is against `idem`.
    IdemSteps,
    /// idem's `execute` (or, over HTTP, the layer) over the same store
    /// behind a `NearCache`: replays answered from the process's memory.
    IdemNear,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Raw => "raw",
            Kind::Blog => "blog",
            Kind::Single => "raw-1tx",
            Kind::Timed => "raw-ttl",
            Kind::Control => "control",
            Kind::Idem => "idem",
            Kind::RawTx => "raw-tx",
            Kind::IdemTx => "idem-tx",
            Kind::IdemSteps => "idem-3steps",
            Kind::IdemNear => "idem-near",
        }
    }
}

/// One row of a store: a protocol and how to count its round trips.
pub(crate) struct Contestant {
    pub(crate) kind: Kind,
    /// Builds the protocol for a run: the same shared one for server stores,
    /// a new one (with an empty store) for in-process stores that would
    /// otherwise grow through the whole benchmark.
    pub(crate) make: Box<dyn Fn() -> Arc<dyn Protocol> + Send + Sync>,
    /// Whether `make` gives a new, empty store each time.
    pub(crate) fresh: bool,
    /// Round trips in a counter delta.
    pub(crate) round_trips: fn(&Counters) -> u64,
}

impl std::fmt::Debug for Contestant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contestant")
            .field("kind", &self.kind)
            .field("fresh", &self.fresh)
            .finish_non_exhaustive()
    }
}

/// A store under test: its rows, its server's counters and its cleanup.
#[async_trait]
pub(crate) trait Bench: Send + Sync {
    /// The store's name in the report.
    fn store(&self) -> &'static str;
    /// Its rows.
    fn contestants(&self) -> Vec<Contestant>;
    /// The server's counters now, if it keeps any.
    async fn counters(&self) -> Result<Option<Counters>, BoxError>;
    /// Removes what a finished cell's first and contended keys left, so that
    /// the store does not grow through the run (replay keys stay).
    async fn tidy(&self) -> Result<(), BoxError>;
    /// Adds store-specific figures to the report and removes every key,
    /// table or file the run made.
    async fn finish(&self, report: &mut Report) -> Result<(), BoxError>;
}

/// What to measure.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) workloads: Vec<Workload>,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) reps: usize,
    pub(crate) limit: Limit,
    pub(crate) warmup: Limit,
    pub(crate) replay_pool: u64,
    pub(crate) tag: String,
    /// Row names to run; empty for all.
    pub(crate) rows: Vec<String>,
}

/// Per-row accumulation over the repetitions of one cell.
#[derive(Default)]
struct Acc {
    reps: Vec<Summary>,
    tally: Tally,
    first_error: Option<String>,
    round_trips: u64,
    delta: Counters,
    counted: bool,
    cpu_per_op_us: Vec<f64>,
}

/// Measures every cell of one store and adds its rows to the report.
pub(crate) async fn measure(
    bench: &dyn Bench,
    plan: &Plan,
    report: &mut Report,
) -> Result<(), BoxError> {
    let contestants: Vec<Contestant> = bench
        .contestants()
        .into_iter()
        .filter(|c| plan.rows.is_empty() || plan.rows.iter().any(|r| r == c.kind.name()))
        .collect();
    let store = bench.store();
    // The shared protocols live for the whole store; fresh ones per run.
    let shared: Vec<Arc<dyn Protocol>> = contestants.iter().map(|c| (c.make)()).collect();
    let mut prepared = vec![false; contestants.len()];
    for &workload in &plan.workloads {
        for &concurrency in &plan.concurrency {
            let keys: Vec<Arc<Keys>> = contestants
                .iter()
                .map(|c| {
                    let prefix = format!("{}.{}.{}.", plan.tag, c.kind.name(), concurrency);
                    let pool_prefix = format!("{}.{}.", plan.tag, c.kind.name());
                    let prefix = if workload == Workload::Replay {
                        pool_prefix
                    } else {
                        prefix
                    };
                    Arc::new(Keys::new(prefix, workload, plan.replay_pool))
                })
                .collect();
            let mut accs: Vec<Acc> = contestants.iter().map(|_| Acc::default()).collect();
            // One warm-up round, then the repetitions, each in a rotated
            // order so that no row always runs first.
            for rep in 0..=plan.reps {
                let warm = rep == 0;
                for turn in 0..contestants.len() {
                    let i = (turn + rep) % contestants.len();
                    let c = &contestants[i];
                    let protocol = if c.fresh {
                        (c.make)()
                    } else {
                        shared[i].clone()
                    };
                    if workload == Workload::Replay && (c.fresh || !prepared[i]) {
                        runner::prepare(&protocol, &keys[i]).await?;
                        prepared[i] = !c.fresh;
                    }
                    let limit = if warm { plan.warmup } else { plan.limit };
                    let before = if warm { None } else { bench.counters().await? };
                    let run = runner::run(protocol, keys[i].clone(), concurrency, limit).await;
                    if warm {
                        continue;
                    }
                    let acc = &mut accs[i];
                    if let (Some(before), Some(after)) = (before, bench.counters().await?) {
                        let delta = delta(&before, &after);
                        acc.round_trips += (c.round_trips)(&delta);
                        for (name, n) in delta {
                            *acc.delta.entry(name).or_default() += n;
                        }
                        acc.counted = true;
                    }
                    if let Some(cpu) = run.cpu.filter(|_| run.tally.ok() > 0) {
                        acc.cpu_per_op_us
                            .push(cpu.as_secs_f64() * 1e6 / run.tally.ok() as f64);
                    }
                    acc.reps.push(run.summary);
                    acc.tally.add(run.tally);
                    acc.first_error = acc.first_error.take().or(run.first_error);
                }
            }
            for (c, acc) in contestants.iter().zip(accs) {
                let ok = acc.tally.ok();
                let per_op = |n: u64| {
                    if ok > 0 {
                        n as f64 / ok as f64
                    } else {
                        f64::NAN
                    }
                };
                let breakdown = acc
                    .delta
                    .iter()
                    .filter(|(_, &n)| n > 0)
                    .map(|(name, &n)| format!("{name} {:.2}", per_op(n)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let row = Row {
                    store,
                    workload,
                    concurrency,
                    kind: c.kind,
                    summary: Summary::median_of(&acc.reps).unwrap_or(Summary {
                        ops_per_sec: 0.0,
                        p50_us: f64::NAN,
                        p99_us: f64::NAN,
                    }),
                    reps: acc.reps,
                    tally: acc.tally,
                    round_trips: acc.counted.then(|| per_op(acc.round_trips)),
                    breakdown: acc.counted.then_some(breakdown),
                    first_error: acc.first_error,
                    cpu_us: stats::median(&acc.cpu_per_op_us),
                };
                eprintln!("{}", row.progress_line());
                report.rows.push(row);
            }
            bench.tidy().await?;
        }
    }
    Ok(())
}

/// How much each counter grew.
fn delta(before: &Counters, after: &Counters) -> Counters {
    after
        .iter()
        .map(|(name, &n)| {
            (
                name.clone(),
                n.saturating_sub(before.get(name).copied().unwrap_or(0)),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_counts_growth_and_new_counters() {
        let before = Counters::from([("get".to_owned(), 5), ("set".to_owned(), 2)]);
        let after = Counters::from([
            ("get".to_owned(), 9),
            ("set".to_owned(), 2),
            ("evalsha".to_owned(), 3),
        ]);
        let d = delta(&before, &after);
        assert_eq!(d["get"], 4);
        assert_eq!(d["set"], 0);
        assert_eq!(d["evalsha"], 3);
    }
}
