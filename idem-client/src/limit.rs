//! A token bucket per host, shared by every clone of a client: idem-http's
//! [`RateLimiter`], the one idem-inbox's handlers use too.

use std::time::Duration;

use idem_http::ratelimit::RateLimiter;
use tokio::time::Instant;

/// An outbound rate limit: at most [`per_second`](Self::per_second)
/// requests a second to each host (scheme, host and port), with bursts of
/// up to [`with_burst`](Self::with_burst) requests.
///
/// The buckets live behind the client, so every clone of it draws from the
/// same ones. A `429` with `Retry-After` holds its host's bucket for that
/// long: no clone sends to that host again before the server asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    per_second: f64,
    burst: u32,
}

impl RateLimit {
    /// `rate` requests a second per host (a rate that is not positive and
    /// finite is taken as one a second, as
    /// [`RateLimiter::new`] takes it), in bursts of one.
    pub fn per_second(rate: f64) -> RateLimit {
        RateLimit {
            per_second: rate,
            burst: 1,
        }
    }

    /// Lets up to `burst` requests (at least 1) go at once after a quiet spell.
    pub fn with_burst(mut self, burst: u32) -> RateLimit {
        self.burst = burst.max(1);
        self
    }
}

/// The buckets of one client and its clones, when it has a [`RateLimit`].
#[derive(Debug, Clone)]
pub(crate) struct Limiter(Option<RateLimiter>);

impl Limiter {
    pub(crate) fn new(limit: Option<RateLimit>) -> Limiter {
        Limiter(limit.map(|l| RateLimiter::new(l.per_second, l.burst)))
    }

    /// Waits until `host` may be sent a request, and takes its token.
    pub(crate) async fn acquire(&self, host: &str) {
        if let Some(limiter) = &self.0 {
            limiter.acquire(host).await;
        }
    }

    /// Holds `host` for `wait`: what a 429's `Retry-After` asks of every
    /// request to it.
    /// Without a [`RateLimit`] nothing is held: each request waits out its
    /// own 429 only.
    pub(crate) fn hold(&self, host: &str, wait: Duration) {
        if let Some(limiter) = &self.0 {
            limiter.pause(host, wait);
        }
    }
}

/// `now + wait`, or a time decades away when that overflows: a server may
/// ask for any number of seconds, and a caller may set any cap or budget.
pub(crate) fn later(now: Instant, wait: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    now.checked_add(wait.min(FAR)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_bucket_lets_a_burst_through_then_paces() {
        let limiter = Limiter::new(Some(RateLimit::per_second(10.0).with_burst(3)));
        let start = Instant::now();
        for _ in 0..3 {
            limiter.acquire("h:80").await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the burst waits for nothing"
        );
        limiter.acquire("h:80").await;
        let paced = start.elapsed();
        assert!(
            paced >= Duration::from_millis(99) && paced <= Duration::from_millis(101),
            "{paced:?}"
        );
        // Another host has its own bucket.
        let other = Instant::now();
        limiter.acquire("other:80").await;
        assert_eq!(other.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_stops_every_clone_until_it_ends() {
        let limiter = Limiter::new(Some(RateLimit::per_second(1e6).with_burst(1000)));
        let clone = limiter.clone();
        limiter.hold("h:80", Duration::from_secs(3));
        let start = Instant::now();
        clone.acquire("h:80").await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        // A shorter hold never shortens a longer one.
        limiter.hold("h:80", Duration::from_secs(5));
        limiter.hold("h:80", Duration::from_secs(1));
        let start = Instant::now();
        clone.acquire("h:80").await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        // Once the hold is over, the bucket paces as before.
        let start = Instant::now();
        for _ in 0..100 {
            clone.acquire("h:80").await;
        }
        assert!(start.elapsed() < Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_rate_nothing_is_held_or_paced() {
        let limiter = Limiter::new(None);
        limiter.hold("h:80", Duration::from_secs(3));
        let start = Instant::now();
        for _ in 0..100 {
            limiter.acquire("h:80").await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
