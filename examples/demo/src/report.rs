//! What a retry storm counted, and the table it prints.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Running counts, shared by every client of a storm.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) requests: AtomicU64,
    pub(crate) settled: AtomicU64,
    pub(crate) created: AtomicU64,
    pub(crate) replays: AtomicU64,
    pub(crate) in_progress: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) errors: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Tally {
    /// Counts the latency of a request that got a complete response.
    pub(crate) fn latency(&self, latency: Duration) {
        self.latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(latency);
    }

    /// Writes the progress line to stderr, over the previous one when
    /// `in_place` (a terminal), or as a line of its own (logs, CI).
    pub(crate) fn progress(&self, intended: usize, in_place: bool) {
        let line = format!(
            "storm: {}/{intended} payments settled · {} requests · {} replays · \
             {} × 409 · {} × 422 · {} dropped · {} errors",
            read(&self.settled),
            read(&self.requests),
            read(&self.replays),
            read(&self.in_progress),
            read(&self.mismatches),
            read(&self.dropped),
            read(&self.errors),
        );
        let mut stderr = std::io::stderr().lock();
        let _ = if in_place {
            write!(stderr, "\r\x1b[2K{line}")
        } else {
            writeln!(stderr, "{line}")
        };
        let _ = stderr.flush();
    }

    /// The counts as a report, before the ledger is checked.
    pub(crate) fn to_report(&self, target: String, intended: usize, elapsed: Duration) -> Report {
        let mut latencies = self
            .latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        latencies.sort_unstable();
        Report {
            target,
            requests: read(&self.requests),
            intended,
            charged: 0,
            double_charged: 0,
            missing: 0,
            wrong: 0,
            created: read(&self.created),
            replays: read(&self.replays),
            in_progress: read(&self.in_progress),
            mismatches: read(&self.mismatches),
            dropped: read(&self.dropped),
            errors: read(&self.errors),
            latency_p50: percentile(&latencies, 50),
            latency_p99: percentile(&latencies, 99),
            elapsed,
        }
    }
}

/// The nearest-rank percentile of sorted samples; zero when there are none.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// The outcome of a retry storm: what the clients saw and what the server's
/// ledger holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The server the storm ran against, and its store when known.
    pub target: String,
    /// Every HTTP request sent, including those dropped by a timeout.
    pub requests: u64,
    /// Distinct payments the clients meant to make, one key each.
    pub intended: usize,
    /// Charges in the ledger under the storm's keys.
    pub charged: usize,
    /// Intended payments charged more than once.
    pub double_charged: usize,
    /// Intended payments never charged.
    pub missing: usize,
    /// Charges or answers that are wrong in another way: a charge for an
    /// altered body or an unknown key, or a client told of a charge that is
    /// not the one in the ledger.
    pub wrong: usize,
    /// 201 answers that ran the handler.
    pub created: u64,
    /// 201 answers replayed from the store (`Idempotent-Replayed: true`).
    pub replays: u64,
    /// 409 answers: the key was in progress.
    pub in_progress: u64,
    /// 422 answers: the key was reused with another body.
    pub mismatches: u64,
    /// Requests the client gave up on before the response arrived.
    pub dropped: u64,
    /// Connection failures, unexpected statuses and payments given up on.
    pub errors: u64,
    /// Median latency of the requests that got a response.
    pub latency_p50: Duration,
    /// 99th percentile latency of the requests that got a response.
    pub latency_p99: Duration,
    /// How long the storm took, the ledger check included.
    pub elapsed: Duration,
}

impl Report {
    /// Whether exactly-once held: every intended payment charged once, and
    /// nothing charged or answered wrongly.
    pub fn passed(&self) -> bool {
        self.double_charged == 0 && self.missing == 0 && self.wrong == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
        let rows: [(&str, String); 15] = [
            ("requests sent", self.requests.to_string()),
            ("charges intended", self.intended.to_string()),
            ("charges made", self.charged.to_string()),
            ("charged twice", self.double_charged.to_string()),
            ("missing", self.missing.to_string()),
            ("wrong", self.wrong.to_string()),
            ("first executions (201)", self.created.to_string()),
            ("replays (201, replayed)", self.replays.to_string()),
            ("in progress (409)", self.in_progress.to_string()),
            ("altered body (422)", self.mismatches.to_string()),
            ("dropped by timeout", self.dropped.to_string()),
            ("errors", self.errors.to_string()),
            ("latency p50", ms(self.latency_p50)),
            ("latency p99", ms(self.latency_p99)),
            ("elapsed", format!("{:.2} s", self.elapsed.as_secs_f64())),
        ];
        writeln!(f, "retry storm against {}", self.target)?;
        for (name, value) in rows {
            writeln!(f, "  {name:<26}{value:>10}")?;
        }
        if self.passed() {
            write!(
                f,
                "exactly once: each of the {} intended payments was charged once",
                self.intended
            )?;
        } else {
            write!(
                f,
                "FAILED: {} charged twice, {} missing, {} wrong",
                self.double_charged, self.missing, self.wrong
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 99), Duration::from_millis(99));
        assert_eq!(percentile(&samples[..1], 99), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }
}
