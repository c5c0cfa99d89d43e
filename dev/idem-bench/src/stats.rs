//! Percentiles, medians and ratios: the only arithmetic the report rests on.

use std::time::Duration;

/// The `p`-th percentile (0–100) of sorted samples, by nearest rank: the
/// smallest sample with at least `p` percent of the samples at or below it.
/// `None` for no samples.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    // Nearest rank is ceil(p/100 * n), 1-based; rank 0 (p = 0) is the minimum.
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of a few values (the middle one, or the mean of the two
/// middle ones). `None` for no values; NaNs sort last.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// Throughput of `candidate` relative to `baseline`: above 1 is faster.
/// `None` when the baseline did nothing (a ratio would be meaningless).
pub(crate) fn ratio(candidate: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0 && candidate.is_finite() && baseline.is_finite()).then(|| candidate / baseline)
}

/// Operations per second.
pub(crate) fn rate(ops: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        ops as f64 / secs
    } else {
        0.0
    }
}

/// What one timed run of one row measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Summary {
    /// Operations per second.
    pub(crate) ops_per_sec: f64,
    /// Median latency, in microseconds.
    pub(crate) p50_us: f64,
    /// 99th-percentile latency, in microseconds.
    pub(crate) p99_us: f64,
}

impl Summary {
    /// Summarises a run from its operation count, wall time and per-operation
    /// latencies in nanoseconds (sorted in place).
    pub(crate) fn of(ops: u64, elapsed: Duration, latencies_ns: &mut [u64]) -> Summary {
        latencies_ns.sort_unstable();
        let us = |p| percentile(latencies_ns, p).map_or(f64::NAN, |ns| ns as f64 / 1000.0);
        Summary {
            ops_per_sec: rate(ops, elapsed),
            p50_us: us(50.0),
            p99_us: us(99.0),
        }
    }

    /// The median of each figure over repetitions.
    pub(crate) fn median_of(runs: &[Summary]) -> Option<Summary> {
        let pick = |f: fn(&Summary) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        Some(Summary {
            ops_per_sec: pick(|s| s.ops_per_sec)?,
            p50_us: pick(|s| s.p50_us)?,
            p99_us: pick(|s| s.p99_us)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_takes_the_nearest_rank() {
        let samples: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&samples, 50.0), Some(50));
        assert_eq!(percentile(&samples, 99.0), Some(99));
        assert_eq!(percentile(&samples, 100.0), Some(100));
        assert_eq!(percentile(&samples, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        assert_eq!(percentile(&[1, 2, 3], 50.0), Some(2));
        assert_eq!(percentile(&[1, 2, 3, 4], 50.0), Some(2));
        assert_eq!(percentile(&[1, 2, 3, 4], 51.0), Some(3));
    }

    #[test]
    fn percentile_of_nothing_is_none() {
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn median_handles_odd_even_and_unsorted_input() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0]), Some(5.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ratio_is_candidate_over_baseline_and_refuses_a_zero_baseline() {
        assert_eq!(ratio(900.0, 1000.0), Some(0.9));
        assert_eq!(ratio(1500.0, 1000.0), Some(1.5));
        assert_eq!(ratio(10.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
    }

    #[test]
    fn summary_reads_rate_and_percentiles_in_microseconds() {
        let mut latencies: Vec<u64> = (1..=1000).rev().map(|i| i * 1000).collect();
        let s = Summary::of(1000, Duration::from_millis(500), &mut latencies);
        assert_eq!(s.ops_per_sec, 2000.0);
        assert_eq!(s.p50_us, 500.0);
        assert_eq!(s.p99_us, 990.0);
    }

    #[test]
    fn median_of_summaries_is_taken_figure_by_figure() {
        let s = |o, p50, p99| Summary {
            ops_per_sec: o,
            p50_us: p50,
            p99_us: p99,
        };
        let m = Summary::median_of(&[s(1.0, 30.0, 5.0), s(3.0, 10.0, 6.0), s(2.0, 20.0, 4.0)]);
        assert_eq!(m, Some(s(2.0, 20.0, 5.0)));
        assert_eq!(Summary::median_of(&[]), None);
    }
}
