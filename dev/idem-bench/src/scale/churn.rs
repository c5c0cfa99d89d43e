//! Purge at scale: ingest at a fixed rate with a short retention while a
//! purger runs on its schedule, on a store already holding the bulk.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::store::Store;
use tokio::task::JoinSet;

use crate::runner::{Outcome, Protocol, Tally};
use crate::stats::Summary;

/// The churn's shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Churn {
    /// First executions per second, spread over [`INGEST_CALLERS`].
    pub(crate) rate: u64,
    /// The retention the ingested records get.
    pub(crate) retention: Duration,
    /// The purger's period.
    pub(crate) every: Duration,
    /// Records asked of `purge_expired` per call.
    pub(crate) batch: usize,
    /// Whether the purger runs; off only for a control run.
    pub(crate) purge: bool,
    /// How long the steady state is measured, with the purger running.
    pub(crate) window: Duration,
}

/// Callers sharing the ingest rate: enough that a slow call does not hold
/// the rate back.
pub(crate) const INGEST_CALLERS: u64 = 16;

/// What the purger did while it was switched on.
#[derive(Debug, Default)]
pub(crate) struct PurgeCounts {
    on: AtomicBool,
    purged: AtomicU64,
    busy_ns: AtomicU64,
    calls: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// When each call began and ended, while switched on.
    spans: Mutex<Vec<(Instant, Instant)>>,
}

impl PurgeCounts {
    pub(crate) fn switch(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Records purged, seconds spent purging, calls and failed calls so far.
    pub(crate) fn read(&self) -> (u64, f64, u64, u64) {
        (
            self.purged.load(Ordering::Relaxed),
            self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
            self.calls.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn first_error(&self) -> Option<String> {
        self.first_error.lock().ok().and_then(|e| e.clone())
    }

    /// When each purge call so far began and ended, in order.
    pub(crate) fn spans(&self) -> Vec<(Instant, Instant)> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Runs `spawn_purger`'s loop (every `every`, batches of `batch` —
/// [`PURGE_BATCH`](idem_core::store::PURGE_BATCH) unless the run says otherwise —
/// until one comes back short) while `counts` is switched on, timing each
/// call: the library's purger with counters the harness can read.
pub(crate) fn spawn_counting_purger(
    store: Arc<dyn Store>,
    every: Duration,
    batch: usize,
    counts: Arc<PurgeCounts>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            while counts.on.load(Ordering::Relaxed) {
                let began = Instant::now();
                let result = store.purge_expired(batch).await;
                let ended = Instant::now();
                counts.busy_ns.fetch_add(
                    u64::try_from((ended - began).as_nanos()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                if let Ok(mut spans) = counts.spans.lock() {
                    spans.push((began, ended));
                }
                counts.calls.fetch_add(1, Ordering::Relaxed);
                match result {
                    Ok(purged) => {
                        counts.purged.fetch_add(purged as u64, Ordering::Relaxed);
                        if purged < batch {
                            break;
                        }
                    }
                    Err(error) => {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut first) = counts.first_error.lock() {
                            first.get_or_insert_with(|| error.to_string());
                        }
                        break;
                    }
                }
            }
        }
    })
}

/// What a stretch of fixed-rate ingest measured.
#[derive(Debug, Clone)]
pub(crate) struct Ingested {
    pub(crate) summary: Summary,
    pub(crate) tally: Tally,
    pub(crate) first_error: Option<String>,
    /// When each successful call began, and its latency in nanoseconds.
    pub(crate) calls: Vec<(Instant, u64)>,
}

/// Calls `protocol` at `rate` per second for `duration`, from
/// [`INGEST_CALLERS`] callers on fixed schedules; a caller that falls
/// behind its schedule delays it rather than bursting, so the achieved
/// rate (in the summary) says whether the store kept up.
pub(crate) async fn ingest(protocol: Arc<dyn Protocol>, rate: u64, duration: Duration) -> Ingested {
    let callers = INGEST_CALLERS.min(rate.max(1));
    let period = Duration::from_secs_f64(callers as f64 / rate.max(1) as f64);
    let start = Instant::now();
    let deadline = start + duration;
    let mut set = JoinSet::new();
    for caller in 0..callers {
        let protocol = protocol.clone();
        set.spawn(async move {
            // Staggered, so the callers do not fire together.
            let offset = period.mul_f64(caller as f64 / callers as f64);
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut calls = Vec::new();
            let mut tally = Tally::default();
            let mut first_error = None;
            loop {
                ticks.tick().await;
                if Instant::now() >= deadline {
                    break;
                }
                let began = Instant::now();
                let result = protocol.op("").await;
                let took = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
                match result {
                    Ok(outcome) => {
                        match outcome {
                            Outcome::Ran => tally.ran += 1,
                            Outcome::Replayed => tally.replayed += 1,
                            Outcome::InProgress => tally.in_progress += 1,
                        }
                        calls.push((began, took));
                    }
                    Err(error) => {
                        tally.errors += 1;
                        first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
            (calls, tally, first_error)
        });
    }
    let mut calls = Vec::new();
    let mut tally = Tally::default();
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((c, t, e)) => {
                calls.extend(c);
                tally.add(t);
                first_error = first_error.or(e);
            }
            Err(panic) => {
                tally.errors += 1;
                first_error.get_or_insert_with(|| format!("a caller panicked: {panic}"));
            }
        }
    }
    let mut latencies: Vec<u64> = calls.iter().map(|&(_, took)| took).collect();
    Ingested {
        summary: Summary::of(tally.ok(), start.elapsed(), &mut latencies),
        tally,
        first_error,
        calls,
    }
}

/// The steady window's claims split by whether they overlapped a purge
/// call: what says whether the purge is what moves the p99, and by how
/// much while it runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Split {
    /// Claims that overlapped a purge call: how many, and their latency.
    pub(crate) during: (usize, Summary),
    /// Claims that did not.
    pub(crate) apart: (usize, Summary),
    /// The purge calls' own durations (p50, p99 and the longest, in µs).
    pub(crate) purge_calls: (usize, Summary, f64),
}

/// Splits `calls` by whether each overlapped one of `purges` (sorted by
/// start, as the purger records them, one at a time).
pub(crate) fn split(calls: &[(Instant, u64)], purges: &[(Instant, Instant)]) -> Split {
    let mut during = Vec::new();
    let mut apart = Vec::new();
    for &(began, took) in calls {
        let ended = began + Duration::from_nanos(took);
        if overlaps(purges, began, ended) {
            during.push(took);
        } else {
            apart.push(took);
        }
    }
    let mut purge_ns: Vec<u64> = purges
        .iter()
        .map(|&(b, e)| u64::try_from((e - b).as_nanos()).unwrap_or(u64::MAX))
        .collect();
    let summary = |v: &mut Vec<u64>| (v.len(), Summary::of(0, Duration::ZERO, v));
    let (calls, purge) = summary(&mut purge_ns);
    // `Summary::of` sorted them: the longest is the last.
    let longest = purge_ns.last().map_or(f64::NAN, |&ns| ns as f64 / 1000.0);
    Split {
        during: summary(&mut during),
        apart: summary(&mut apart),
        purge_calls: (calls, purge, longest),
    }
}

/// Whether `[began, ended]` overlaps any span of `spans`, which are sorted
/// by start and do not overlap each other.
pub(crate) fn overlaps(spans: &[(Instant, Instant)], began: Instant, ended: Instant) -> bool {
    // The spans starting before the call ends; of those, only the last can
    // still be running when the call begins.
    let before_end = spans.partition_point(|&(start, _)| start < ended);
    before_end > 0 && spans[before_end - 1].1 > began
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_overlaps_a_purge_only_when_their_times_intersect() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        let purges = [(at(10), at(20)), (at(40), at(55))];
        assert!(!overlaps(&purges, at(0), at(5)), "before every purge");
        assert!(overlaps(&purges, at(5), at(15)), "into the first");
        assert!(overlaps(&purges, at(12), at(18)), "inside the first");
        assert!(overlaps(&purges, at(15), at(45)), "across the gap");
        assert!(!overlaps(&purges, at(21), at(39)), "in the gap");
        assert!(overlaps(&purges, at(5), at(60)), "around both");
        assert!(!overlaps(&purges, at(56), at(60)), "after every purge");
        assert!(!overlaps(&[], at(0), at(60)), "no purge at all");

        let calls = [(at(0), 5_000_000), (at(12), 1_000_000), (at(45), 2_000_000)];
        let split = split(&calls, &purges);
        assert_eq!(split.during.0, 2);
        assert_eq!(split.apart.0, 1);
        assert_eq!(split.apart.1.p99_us, 5_000.0);
        assert_eq!(split.purge_calls.0, 2);
        assert_eq!(split.purge_calls.2, 15_000.0, "the longest purge call");
    }
}
