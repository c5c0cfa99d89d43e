//! How long a failed job waits before its next attempt.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with full jitter and a cap.
///
/// After attempt `n` (1 for the first) fails, the job waits a uniformly
/// random time in `[0, min(cap, base · 2^n)]`. The default base of one
/// minute gives the shape `2^n` minutes — up to 2, 4, 8, … minutes — capped
/// at six hours. Full jitter spreads a burst of failures (an outage of the
/// API a handler calls) so the retries do not arrive together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_secs(60),
            cap: Duration::from_secs(6 * 60 * 60),
        }
    }
}

impl Backoff {
    /// Backoff of `base · 2^n`, jittered, at most `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff { base, cap }
    }

    /// The longest wait after attempt `attempt` fails: `min(cap, base ·
    /// 2^attempt)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 2u32.checked_pow(attempt).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// A wait after attempt `attempt` fails: uniform in `[0, ceiling]`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        if ceiling.is_zero() {
            return Duration::ZERO;
        }
        rand::rng().random_range(Duration::ZERO..=ceiling)
    }
}
