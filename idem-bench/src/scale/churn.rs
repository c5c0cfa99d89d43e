//! Purge at scale: ingest at a fixed rate with a short retention while a
//! purger runs on its schedule, on a store already holding the bulk.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{Store, PURGE_BATCH};
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
}

/// Runs `spawn_purger`'s loop (every `every`, batches of [`PURGE_BATCH`]
/// until one comes back short) while `counts` is switched on, timing each
/// call: the library's purger with counters the harness can read.
pub(crate) fn spawn_counting_purger(
    store: Arc<dyn Store>,
    every: Duration,
    counts: Arc<PurgeCounts>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            while counts.on.load(Ordering::Relaxed) {
                let began = Instant::now();
                let result = store.purge_expired(PURGE_BATCH).await;
                counts.busy_ns.fetch_add(
                    u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                counts.calls.fetch_add(1, Ordering::Relaxed);
                match result {
                    Ok(purged) => {
                        counts.purged.fetch_add(purged as u64, Ordering::Relaxed);
                        if purged < PURGE_BATCH {
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
            let mut latencies = Vec::new();
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
                        latencies.push(took);
                    }
                    Err(error) => {
                        tally.errors += 1;
                        first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
            (latencies, tally, first_error)
        });
    }
    let mut latencies = Vec::new();
    let mut tally = Tally::default();
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((l, t, e)) => {
                latencies.extend(l);
                tally.add(t);
                first_error = first_error.or(e);
            }
            Err(panic) => {
                tally.errors += 1;
                first_error.get_or_insert_with(|| format!("a caller panicked: {panic}"));
            }
        }
    }
    Ingested {
        summary: Summary::of(tally.ok(), start.elapsed(), &mut latencies),
        tally,
        first_error,
    }
}
