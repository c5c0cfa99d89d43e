//! How long a retry waits: exponential backoff with full jitter, the one
//! policy behind idem-inbox's failed jobs, idem-broker's redeliveries and
//! idem-client's HTTP retries.
//!
//! It lives in the core because it knows no protocol: what a `Retry-After`
//! header, a handler's own delay or a broker's redelivery limit asks is
//! each caller's to weigh against it. Here it costs both the inbox and the
//! client nothing, as both depend on the core already and the core already
//! has `rand`.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with full jitter and a cap.
///
/// After attempt `n` (1 for the first) fails, the wait is a uniformly
/// random time in `[0, min(cap, first · 2^(n-1))]`: at most `first` after
/// the first failure, a ceiling that doubles with every further one. Full
/// jitter (AWS's "full jitter" scheme) spreads a crowd of retries that
/// failed together, as an outage of the API they call makes them, over the
/// whole window instead of sending them back together.
///
/// The default, for background jobs, waits up to 2, 4, 8, … minutes,
/// capped at six hours; an interactive caller wants milliseconds (the
/// client's default is 100 ms up to 5 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
}

impl Default for Backoff {
    /// Up to 2 minutes after the first failure, doubling, capped at 6 hours.
    fn default() -> Backoff {
        Backoff {
            first: Duration::from_secs(2 * 60),
            cap: Duration::from_secs(6 * 60 * 60),
        }
    }
}

impl Backoff {
    /// Waits of at most `first` after the first failure, doubling after
    /// each further one, never past `cap` (a `cap` below `first` caps every
    /// wait at `cap`).
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff { first, cap }
    }

    /// The longest wait after attempt `attempt` (1-based) fails:
    /// `min(cap, first · 2^(attempt-1))`. Attempt 0 is read as 1, and the
    /// doubling saturates instead of overflowing.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 2u32
            .checked_pow(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.cap)
    }

    /// A wait after attempt `attempt` fails: uniform in
    /// `[0, ceiling(attempt)]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        if ceiling.is_zero() {
            return Duration::ZERO;
        }
        rand::rng().random_range(Duration::ZERO..=ceiling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ceiling_starts_at_first_and_doubles_up_to_the_cap() {
        let b = Backoff::new(10 * MS, 80 * MS);
        let ceilings: Vec<_> = (0..=6).map(|n| b.ceiling(n)).collect();
        assert_eq!(
            ceilings,
            [
                10 * MS,
                10 * MS,
                20 * MS,
                40 * MS,
                80 * MS,
                80 * MS,
                80 * MS
            ]
        );
        assert_eq!(b.ceiling(u32::MAX), 80 * MS);
        // The doubling saturates rather than wrapping to a short wait.
        let uncapped = Backoff::new(Duration::from_secs(1), Duration::MAX);
        assert_eq!(
            uncapped.ceiling(33),
            Duration::from_secs(u64::from(u32::MAX))
        );
        assert_eq!(Backoff::new(10 * MS, 3 * MS).ceiling(1), 3 * MS);
    }

    #[test]
    fn waits_are_spread_over_the_whole_window_and_never_past_it() {
        let b = Backoff::new(10 * MS, Duration::from_secs(60));
        for attempt in 1..=4 {
            let ceiling = b.ceiling(attempt);
            let waits: Vec<_> = (0..1000).map(|_| b.delay(attempt)).collect();
            assert!(waits.iter().all(|w| *w <= ceiling), "attempt {attempt}");
            // Every quarter of the window is hit: full jitter, not a wait
            // clustered near the ceiling (a quarter left empty by chance
            // has odds of 4 · 0.75^1000).
            for quarter in 0..4 {
                let (low, high) = (ceiling * quarter / 4, ceiling * (quarter + 1) / 4);
                assert!(
                    waits.iter().any(|w| low <= *w && *w <= high),
                    "attempt {attempt}: nothing in [{low:?}, {high:?}]"
                );
            }
        }
        assert_eq!(
            Backoff::new(Duration::ZERO, Duration::ZERO).delay(5),
            Duration::ZERO
        );
    }
}
