//! An outbound rate limit per destination: a token bucket each, and the
//! pause a `429 Too Many Requests` asks for with `Retry-After`.
//!
//! Both crates that call out use it: idem-client paces its requests per
//! host, and an idem-inbox handler paces its calls to the APIs it feeds.
//! It lives in the HTTP protocol crate because the pause is HTTP's and
//! both can depend on this crate cheaply, while the core, which every store
//! depends on, stays without a rate limiter.
//!
//! The buckets are [governor]'s (GCRA, one cell state per key) on tokio's
//! clock, so tests pause and advance them with `tokio::time`. Only the
//! pause is written here: governor has no way to hold a key until a given
//! time.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::HashMapStateStore;
use governor::Quota;
use tokio::time::Instant;

/// A token bucket per destination: `rate` requests a second on average,
/// bursts of up to `burst`; and the pause a destination asked for with a
/// 429 and `Retry-After`, which holds every caller for that destination.
///
/// Clones share the buckets and the pauses. A pause is a gate in front of
/// the bucket: it neither drains nor fills it, so once it ends the
/// destination gets what its bucket then holds (a full burst, after a
/// pause long enough to refill it) and the rate after that — what it would
/// get after any quiet spell as long.
///
/// Runs on tokio's clock, so tests can pause and advance it.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    buckets: governor::RateLimiter<
        String,
        HashMapStateStore<String>,
        TokioClock,
        NoOpMiddleware<std::time::Instant>,
    >,
    paused_until: Mutex<HashMap<String, Instant>>,
}

/// governor's clock read from tokio's, which tests pause and advance.
#[derive(Debug, Clone, Copy)]
struct TokioClock;

impl Clock for TokioClock {
    type Instant = std::time::Instant;

    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }
}

// governor counts time in u64 nanoseconds and panics past them, so a rate
// so low that a full burst would take longer than this to refill is raised
// to refill it in this long.
const LONGEST_REFILL: Duration = Duration::from_secs(365 * 24 * 3600);

// A pause so long that it would overflow the clock ends in 30 years instead.
const FOREVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

impl RateLimiter {
    /// `rate` requests a second per destination, bursts of `burst` (at
    /// least 1). A rate that is not positive and finite is taken as one a
    /// second; one above a request a nanosecond, as that.
    pub fn new(rate: f64, burst: u32) -> RateLimiter {
        let rate = if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            1.0
        };
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        let longest = LONGEST_REFILL / burst.get();
        let period = Duration::try_from_secs_f64(rate.recip())
            .unwrap_or(longest)
            .clamp(Duration::from_nanos(1), longest);
        let quota = Quota::with_period(period)
            .expect("a period of at least a nanosecond")
            .allow_burst(burst);
        RateLimiter {
            inner: Arc::new(Inner {
                buckets: governor::RateLimiter::hashmap_with_clock(quota, TokioClock),
                paused_until: Mutex::default(),
            }),
        }
    }

    /// Waits until a request to `destination` may go, and takes its token.
    pub async fn acquire(&self, destination: &str) {
        while let Some(wait) = self.try_acquire(destination) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a token for `destination` if one is free now; otherwise returns
    /// how long until one may be.
    pub fn try_acquire(&self, destination: &str) -> Option<Duration> {
        {
            let now = Instant::now();
            let mut paused = self.paused();
            if let Some(&until) = paused.get(destination) {
                if until > now {
                    return Some(until - now);
                }
                paused.remove(destination);
            }
        }
        match self.inner.buckets.check_key(&destination.to_owned()) {
            Ok(()) => None,
            Err(not_until) => Some(not_until.wait_time_from(TokioClock.now())),
        }
    }

    /// Holds every request to `destination` for `retry_after`: what a 429
    /// answer asked for. A shorter pause never shortens a longer one.
    pub fn pause(&self, destination: &str, retry_after: Duration) {
        let now = Instant::now();
        let until = now
            .checked_add(retry_after)
            .unwrap_or_else(|| now + FOREVER);
        let mut paused = self.paused();
        let held = paused.entry(destination.to_owned()).or_insert(until);
        *held = (*held).max(until);
    }

    fn paused(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        // The map is whole between statements, so a panic elsewhere while
        // it was locked leaves it usable.
        self.inner
            .paused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn the_bucket_refills_at_the_rate_up_to_the_burst() {
        let limiter = RateLimiter::new(10.0, 3);
        for _ in 0..3 {
            assert_eq!(limiter.try_acquire("api"), None, "the burst is free");
        }
        assert_eq!(limiter.try_acquire("api"), Some(100 * MS));
        tokio::time::advance(250 * MS).await;
        // Two and a half tokens came back: two go now, the third in 50 ms.
        assert_eq!(limiter.try_acquire("api"), None);
        assert_eq!(limiter.try_acquire("api"), None);
        assert_eq!(limiter.try_acquire("api"), Some(50 * MS));
        // A long quiet spell refills the burst and no more.
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            assert_eq!(limiter.try_acquire("api"), None);
        }
        assert_eq!(limiter.try_acquire("api"), Some(100 * MS));
        // Another destination has a bucket of its own.
        assert_eq!(limiter.try_acquire("other"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_the_destination_without_draining_its_bucket() {
        let limiter = RateLimiter::new(10.0, 3);
        let clone = limiter.clone();
        limiter.pause("api", Duration::from_secs(2));
        limiter.pause("api", Duration::from_secs(1));
        assert_eq!(clone.try_acquire("api"), Some(Duration::from_secs(2)));
        assert_eq!(clone.try_acquire("other"), None, "only `api` is paused");
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..3 {
            assert_eq!(clone.try_acquire("api"), None, "the burst waited");
        }
        assert_eq!(clone.try_acquire("api"), Some(100 * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn rates_out_of_range_are_brought_into_it() {
        // Not positive or not finite: one a second.
        for rate in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            let limiter = RateLimiter::new(rate, 0);
            assert_eq!(limiter.try_acquire("api"), None, "rate {rate}");
            assert_eq!(limiter.try_acquire("api"), Some(Duration::from_secs(1)));
        }
        // Far too slow to count in nanoseconds: a burst refills in a year.
        let slow = RateLimiter::new(f64::MIN_POSITIVE, 2);
        assert_eq!(slow.try_acquire("api"), None);
        assert_eq!(slow.try_acquire("api"), None);
        assert_eq!(slow.try_acquire("api"), Some(LONGEST_REFILL / 2));
        // A pause past the clock's end holds, and does not panic.
        slow.pause("api", Duration::MAX);
        assert_eq!(slow.try_acquire("api"), Some(FOREVER));
    }
}
