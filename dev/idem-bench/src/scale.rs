//! The scale binary: how claim and replay latency, purging and bytes per
//! record behave as a store fills to millions of records.
//!
//! For each store it writes one record through `execute` (the template),
//! then fills the store in bulk, in steps up to each size, with copies of
//! that record under fresh keys and tokens: server-side where the store
//! allows (`generate_series` on PostgreSQL, the Sequence engine on MariaDB,
//! a recursive series on SQLite), through `insert` from many callers
//! otherwise (memory, Redis). At each size it measures, through `execute`,
//! first executions on fresh keys spread over the key space and replays of
//! bulk keys picked at random, at each concurrency; every replay must find
//! and decode its bulk record, or the run fails. First executions get a
//! short retention and are purged after each run, so the store stays at
//! its size. It then weighs the store (bytes per record against the raw
//! protocol's record content) and, at the largest size, churns it: ingest
//! at a fixed rate with a short retention, first with nothing expiring yet
//! (the baseline), then, once expiry and purging reach a steady state,
//! with the purger running on its schedule.

use std::convert::Infallible;
use std::future::ready;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem_core::store::{Record, Store};
use idem_core::{Error, Idempotent, DEFAULT_LEASE};
use idem_stores::StoreKind;

use crate::fixture::{BoxError, Order};
use crate::runner::{self, Keys, Limit, Outcome, Protocol, Tally, Workload};
use crate::stats::Summary;
use crate::stores::Places;

mod churn;
mod render;

pub(crate) use churn::Churn;
pub(crate) use render::{markdown, render};

use crate::stores::target::{self, Footprint, Opened, Target, BULK_RETENTION};
use churn::{Ingested, PurgeCounts};

/// What the scale mode measures.
#[derive(Debug, Clone)]
pub(crate) struct ScalePlan {
    /// Record counts to fill to, ascending; the first is the baseline.
    pub(crate) sizes: Vec<u64>,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) reps: usize,
    pub(crate) run: Duration,
    pub(crate) warmup: Duration,
    pub(crate) churn: Churn,
    /// The retention (and lease) of first executions made while
    /// measuring: short, so they are purged after each run and the store
    /// stays at its size; long enough that a loaded machine's stall
    /// between claim and completion does not outlast the lease.
    pub(crate) first_retention: Duration,
    pub(crate) tag: String,
}

/// Reads a record count: `100000`, `10k`, `1m`, `1.5m`.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim().to_ascii_lowercase();
    let (number, factor) = match text.strip_suffix('k') {
        Some(n) => (n, 1e3),
        None => match text.strip_suffix('m') {
            Some(n) => (n, 1e6),
            None => (text.as_str(), 1.0),
        },
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a record count such as 10k or 1m"))?;
    let count = value * factor;
    if !(1.0..=1e10).contains(&count) || count.fract() != 0.0 {
        return Err(format!(
            "{text:?} is not a whole count between 1 and 10 000 m"
        ));
    }
    Ok(count as u64)
}

/// One measured cell: a store at a size, a workload, a concurrency.
#[derive(Debug, Clone)]
pub(crate) struct Cell {
    pub(crate) store: &'static str,
    pub(crate) size: u64,
    /// The largest size measured alongside, in alternation: the growing
    /// store's, for the baseline store's cells.
    pub(crate) alongside: u64,
    pub(crate) workload: Workload,
    pub(crate) concurrency: usize,
    /// Medians over the repetitions.
    pub(crate) summary: Summary,
    pub(crate) tally: Tally,
    pub(crate) first_error: Option<String>,
}

/// A store at a size: how long filling took and what it weighs.
#[derive(Debug, Clone)]
pub(crate) struct Weighed {
    pub(crate) store: &'static str,
    pub(crate) size: u64,
    pub(crate) fill: Duration,
    pub(crate) footprint: Footprint,
    /// The raw protocol's record content for one bulk record: key, state,
    /// token, fingerprint, payload and one deadline.
    pub(crate) raw_record: u64,
}

/// The churn of one store.
#[derive(Debug, Clone)]
pub(crate) struct Churned {
    pub(crate) store: &'static str,
    pub(crate) bulk: u64,
    pub(crate) churn: Churn,
    /// Ingest before anything expired: nothing to purge.
    pub(crate) baseline: Ingested,
    /// Ingest at steady state with the purger running.
    pub(crate) steady: Ingested,
    /// Records purged, seconds spent purging, calls, failed calls, over the
    /// steady window.
    pub(crate) purged: u64,
    pub(crate) purge_busy: f64,
    pub(crate) purge_calls: u64,
    pub(crate) purge_errors: u64,
    pub(crate) purge_error: Option<String>,
    /// The steady window's claims, split by whether a purge call ran
    /// beside them.
    pub(crate) split: churn::Split,
    /// Rows held beyond the bulk at the end of the steady window, where the
    /// store counts them.
    pub(crate) held: Option<u64>,
    /// Wall time from the first ingest to the end.
    pub(crate) churned_for: Duration,
    pub(crate) notes: Vec<String>,
}

/// Everything the mode measured.
#[derive(Debug, Default)]
pub(crate) struct ScaleReport {
    pub(crate) cells: Vec<Cell>,
    pub(crate) sizes: Vec<Weighed>,
    pub(crate) churns: Vec<Churned>,
    pub(crate) skipped: Vec<String>,
}

impl ScaleReport {
    /// Operations that failed anywhere.
    pub(crate) fn errors(&self) -> u64 {
        self.cells.iter().map(|c| c.tally.errors).sum::<u64>()
            + self
                .churns
                .iter()
                .map(|c| c.baseline.tally.errors + c.steady.tally.errors + c.purge_errors)
                .sum::<u64>()
    }
}

/// Runs the mode on every store in `stores`.
pub(crate) async fn run(
    stores: &[StoreKind],
    places: Places<'_>,
    plan: &ScalePlan,
) -> Result<ScaleReport, BoxError> {
    let mut report = ScaleReport::default();
    eprintln!("idem-bench: scale {plan:?}");
    for &kind in stores {
        // The baseline store, filled to the first size, opens first so
        // that the growing store's weight (memory and Redis measure growth
        // since opening) leaves the baseline's records out.
        let Some(base) = open(kind, places, &format!("{}a", plan.tag), &mut report).await? else {
            continue;
        };
        let measured = measure(base.as_ref(), kind, places, plan, &mut report).await;
        let removed = base.remove_all().await;
        measured?;
        removed?;
    }
    Ok(report)
}

async fn open(
    kind: StoreKind,
    places: Places<'_>,
    tag: &str,
    report: &mut ScaleReport,
) -> Result<Option<Box<dyn Target>>, BoxError> {
    Ok(match target::open(kind, places, tag).await? {
        Opened::Target(target) => Some(target),
        Opened::Skipped(url, reason) => {
            let line = format!(
                "{} at {url} is unreachable ({reason}); its scale rows are skipped",
                kind.name()
            );
            eprintln!("idem-bench: {line}");
            report.skipped.push(line);
            None
        }
    })
}

/// `execute` on keys of the row's choosing, with a trivial work returning
/// the 100-byte outcome.
struct ScaleRow {
    idem: Idempotent,
    body: Order,
    outcome: String,
    keys: Choice,
}

enum Choice {
    /// A fresh key, random over the key space: `{tag}.{random}x` sorts
    /// among the bulk keys `{tag}.{n}` and never equals one.
    Fresh(String),
    /// A bulk key `{tag}.{n}`, `n` random below the count; it must replay.
    Bulk(String, u64),
}

#[async_trait]
impl Protocol for ScaleRow {
    async fn op(&self, _key: &str) -> Result<Outcome, BoxError> {
        let key = match &self.keys {
            Choice::Fresh(tag) => format!("{tag}.{}x", rand::random::<u64>()),
            Choice::Bulk(tag, count) => format!("{tag}.{}", rand::random::<u64>() % count),
        };
        let mut ran = false;
        let result: Result<String, Error<Infallible>> = self
            .idem
            .execute(&key, &self.body, || {
                ran = true;
                ready(Ok(self.outcome.clone()))
            })
            .await;
        match (result, &self.keys) {
            (Ok(_), Choice::Bulk(..)) if ran => {
                Err(format!("bulk key {key} was not found, so its work ran").into())
            }
            (Ok(_), _) if ran => Ok(Outcome::Ran),
            (Ok(_), _) => Ok(Outcome::Replayed),
            (Err(Error::InProgress { .. }), _) => Ok(Outcome::InProgress),
            (Err(error), _) => Err(error.into()),
        }
    }
}

fn row(store: &Arc<dyn Store>, retention: Duration, keys: Choice) -> Arc<dyn Protocol> {
    Arc::new(ScaleRow {
        // A completion keeps the record for the longer of retention and
        // lease, so a short retention needs a lease no longer.
        idem: Idempotent::from_arc(store.clone())
            .with_lease(retention.min(DEFAULT_LEASE))
            .with_retention(retention),
        body: Order::sample(),
        outcome: crate::fixture::outcome(),
        keys,
    })
}

/// Purges until a batch comes back short.
async fn purge_all(target: &dyn Target) -> Result<u64, BoxError> {
    let (store, batch) = (target.store(), target.clearing_batch());
    let mut purged = 0;
    loop {
        let n = store.purge_expired(batch).await?;
        purged += n as u64;
        if n < batch {
            return Ok(purged);
        }
    }
}

/// Writes the template record through `execute` and returns the stored
/// key prefix of the bulk keys, the template's stored key and its record.
async fn template(store: &Arc<dyn Store>, tag: &str) -> Result<(String, String, Record), BoxError> {
    let idem = Idempotent::from_arc(store.clone()).with_retention(BULK_RETENTION);
    // Bulk keys are stored as `{prefix}{n}`: the key encoding appends the
    // client key, which this checks rather than assumes.
    let prefix = idem.key(&format!("{tag}."))?.as_str().to_owned();
    if idem.key(&format!("{tag}.42"))?.as_str() != format!("{prefix}42") {
        return Err("the key encoding no longer appends the client key".into());
    }
    let key = idem.key(&format!("{tag}.t"))?.as_str().to_owned();
    let _: String = idem
        .execute(&format!("{tag}.t"), &Order::sample(), || {
            ready(Ok::<_, Infallible>(crate::fixture::outcome()))
        })
        .await
        .map_err(|e| format!("writing the template record: {e}"))?;
    let record = store
        .load(&key)
        .await?
        .ok_or("the template record is not there")?;
    Ok((prefix, key, record))
}

/// Fills `target` from `from` to `to` records and says how long it took.
async fn fill(
    target: &dyn Target,
    shape: &(String, String, Record),
    from: u64,
    to: u64,
) -> Result<Duration, BoxError> {
    let name = target.name();
    eprintln!("idem-bench: scale {name}: filling to {to}");
    let began = Instant::now();
    target
        .fill(&shape.0, &shape.1, &shape.2, from, to)
        .await
        .map_err(|e| format!("{name}: filling to {to}: {e}"))?;
    let took = began.elapsed();
    eprintln!(
        "idem-bench: scale {name}: {to} records in {:.1} s",
        took.as_secs_f64()
    );
    Ok(took)
}

/// Weighs `target` at `size` records.
async fn weigh(
    target: &dyn Target,
    shape: &(String, String, Record),
    size: u64,
    fill: Duration,
) -> Result<Weighed, BoxError> {
    let footprint = target.footprint().await?;
    // The mean length of the stored keys `{prefix}0` … `{prefix}{size-1}`.
    let digits: u64 = (0..20)
        .map(|d: u32| {
            let low = if d == 0 { 0 } else { 10u64.pow(d) };
            let high = 10u64.pow(d).saturating_mul(10);
            size.min(high).saturating_sub(low) * (u64::from(d) + 1)
        })
        .sum();
    let key = shape.0.len() as u64 + digits / size.max(1);
    Ok(Weighed {
        store: target.name(),
        size,
        fill,
        footprint,
        raw_record: key + 1 + 16 + 32 + shape.2.payload.len() as u64 + 8,
    })
}

/// Fills the baseline store to the first size, then a second store of the
/// same kind to each size in turn, measuring the two alternately at each
/// (so machine noise hits both alike), and churns the second at the
/// largest.
async fn measure(
    base: &dyn Target,
    kind: StoreKind,
    places: Places<'_>,
    plan: &ScalePlan,
    report: &mut ScaleReport,
) -> Result<(), BoxError> {
    let Some((&smallest, larger)) = plan.sizes.split_first() else {
        return Ok(());
    };
    let base_shape = template(&base.store(), &plan.tag).await?;
    let took = fill(base, &base_shape, 0, smallest).await?;
    let weighed = weigh(base, &base_shape, smallest, took).await?;
    eprintln!("{}", render::bytes_line(&weighed));
    report.sizes.push(weighed);
    if larger.is_empty() {
        for (workload, concurrency) in cells(plan) {
            let pair = [(base, smallest)];
            let [cell] = measure_cells(&pair, plan, workload, concurrency, smallest).await?;
            eprintln!("{}", render::cell_line(&cell));
            report.cells.push(cell);
        }
        let churned = churn_store(base, plan, smallest).await?;
        eprint!("{}", render::churn_lines(&churned));
        report.churns.push(churned);
        return Ok(());
    }
    let Some(big) = open(kind, places, &format!("{}b", plan.tag), report).await? else {
        return Ok(());
    };
    let measured = grow(base, smallest, big.as_ref(), larger, plan, report).await;
    let removed = big.remove_all().await;
    measured?;
    removed
}

async fn grow(
    base: &dyn Target,
    smallest: u64,
    big: &dyn Target,
    sizes: &[u64],
    plan: &ScalePlan,
    report: &mut ScaleReport,
) -> Result<(), BoxError> {
    let shape = template(&big.store(), &plan.tag).await?;
    let mut filled = 0;
    for &size in sizes {
        let took = fill(big, &shape, filled, size).await?;
        filled = size;
        // Weighed before the measured part, whose short-lived records
        // Redis would still be expiring.
        let weighed = weigh(big, &shape, size, took).await?;
        eprintln!("{}", render::bytes_line(&weighed));
        report.sizes.push(weighed);
        for (workload, concurrency) in cells(plan) {
            let pair = [(base, smallest), (big, size)];
            for cell in measure_cells(&pair, plan, workload, concurrency, size).await? {
                eprintln!("{}", render::cell_line(&cell));
                report.cells.push(cell);
            }
        }
    }
    let churned = churn_store(big, plan, filled).await?;
    eprint!("{}", render::churn_lines(&churned));
    report.churns.push(churned);
    Ok(())
}

fn cells(plan: &ScalePlan) -> Vec<(Workload, usize)> {
    [Workload::First, Workload::Replay]
        .into_iter()
        .flat_map(|w| plan.concurrency.iter().map(move |&c| (w, c)))
        .collect()
}

/// Measures one workload at one concurrency on each `(target, size)`,
/// the targets' runs alternating within each repetition in a rotated
/// order. `alongside` is the largest size of the group.
async fn measure_cells<const N: usize>(
    targets: &[(&dyn Target, u64); N],
    plan: &ScalePlan,
    workload: Workload,
    concurrency: usize,
    alongside: u64,
) -> Result<[Cell; N], BoxError> {
    let tag = &plan.tag;
    let rows: Vec<Arc<dyn Protocol>> = targets
        .iter()
        .map(|(target, size)| match workload {
            Workload::Replay => row(
                &target.store(),
                BULK_RETENTION,
                Choice::Bulk(tag.clone(), *size),
            ),
            _ => row(
                &target.store(),
                plan.first_retention,
                Choice::Fresh(tag.clone()),
            ),
        })
        .collect();
    let keys = Arc::new(Keys::new(String::new(), workload, 1));
    let mut summaries: [Vec<Summary>; N] = std::array::from_fn(|_| Vec::new());
    let mut tallies = [Tally::default(); N];
    let mut errors: [Option<String>; N] = std::array::from_fn(|_| None);
    for rep in 0..=plan.reps {
        let limit = Limit::Time(if rep == 0 { plan.warmup } else { plan.run });
        for turn in 0..N {
            let i = (turn + rep) % N;
            let run = runner::run(rows[i].clone(), keys.clone(), concurrency, limit).await;
            if workload == Workload::First {
                // Let this run's records expire and purge them (Redis
                // expires them itself), so the next run meets the store at
                // its size.
                tokio::time::sleep(plan.first_retention + Duration::from_millis(50)).await;
                purge_all(targets[i].0).await?;
            }
            if rep == 0 {
                continue;
            }
            summaries[i].push(run.summary);
            tallies[i].add(run.tally);
            errors[i] = errors[i].take().or(run.first_error);
        }
    }
    let mut out = Vec::with_capacity(N);
    for (i, (target, size)) in targets.iter().enumerate() {
        out.push(Cell {
            store: target.name(),
            size: *size,
            alongside,
            workload,
            concurrency,
            summary: Summary::median_of(&summaries[i]).ok_or("no repetitions")?,
            tally: tallies[i],
            first_error: errors[i].take(),
        });
    }
    out.try_into().map_err(|_| "a cell went missing".into())
}

async fn churn_store(
    target: &dyn Target,
    plan: &ScalePlan,
    bulk: u64,
) -> Result<Churned, BoxError> {
    let name = target.name();
    let store = target.store();
    let shape = plan.churn;
    eprintln!("idem-bench: scale {name}: churn {shape:?} on {bulk} records");
    let protocol = row(
        &store,
        shape.retention,
        Choice::Fresh(format!("{}c", plan.tag)),
    );
    let counts = Arc::new(PurgeCounts::default());
    let purger =
        churn::spawn_counting_purger(store.clone(), shape.every, shape.batch, counts.clone());
    let began = Instant::now();
    // Nothing has expired yet, so nothing is purged: the baseline. It ends
    // before the first of its records expires.
    let baseline_for = shape.window.min(shape.retention.mul_f64(0.8));
    let baseline = churn::ingest(protocol.clone(), shape.rate, baseline_for).await;
    // Expiry starts; with the purger on, a steady state is reached once a
    // full retention of records has expired and been purged.
    counts.switch(shape.purge);
    let settle = (shape.retention + shape.every * 2).saturating_sub(baseline_for);
    let _ = churn::ingest(protocol.clone(), shape.rate, settle).await;
    let (purged_before, busy_before, calls_before, errors_before) = counts.read();
    let steady_began = Instant::now();
    let steady = churn::ingest(protocol.clone(), shape.rate, shape.window).await;
    let (purged_after, busy_after, calls_after, errors_after) = counts.read();
    let mut purges = counts.spans();
    purges.retain(|&(_, ended)| ended > steady_began);
    let split = churn::split(&steady.calls, &purges);
    let held = target.rows().await?.map(|n| n.saturating_sub(bulk + 1));
    let notes = target.after_churn().await?;
    let churned_for = began.elapsed();
    counts.switch(false);
    purger.abort();
    Ok(Churned {
        store: name,
        bulk,
        churn: shape,
        baseline,
        steady,
        purged: purged_after - purged_before,
        purge_busy: busy_after - busy_before,
        purge_calls: calls_after - calls_before,
        purge_errors: errors_after - errors_before,
        purge_error: counts.first_error(),
        split,
        held,
        churned_for,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_plain_and_suffixed_counts() {
        assert_eq!(parse_size("100000"), Ok(100_000));
        assert_eq!(parse_size("10k"), Ok(10_000));
        assert_eq!(parse_size("1M"), Ok(1_000_000));
        assert_eq!(parse_size("1.5m"), Ok(1_500_000));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1.5").is_err());
        assert!(parse_size("ten").is_err());
    }
}
