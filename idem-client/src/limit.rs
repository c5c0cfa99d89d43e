//! A token bucket per host, shared by every clone of a client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

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
    burst: f64,
}

impl RateLimit {
    /// `rate` requests a second per host (a rate that is not positive and
    /// finite is taken as one a second), in bursts of one.
    pub fn per_second(rate: f64) -> RateLimit {
        let per_second = if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            1.0
        };
        RateLimit {
            per_second,
            burst: 1.0,
        }
    }

    /// Lets up to `burst` requests (at least 1) go at once after a quiet spell.
    pub fn with_burst(mut self, burst: u32) -> RateLimit {
        self.burst = f64::from(burst.max(1));
        self
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    held_until: Option<Instant>,
}

/// The buckets of one client and its clones.
#[derive(Debug, Clone)]
pub(crate) struct Limiter {
    limit: Option<RateLimit>,
    hosts: Arc<Mutex<HashMap<String, Bucket>>>,
}

impl Limiter {
    pub(crate) fn new(limit: Option<RateLimit>) -> Limiter {
        Limiter {
            limit,
            hosts: Arc::default(),
        }
    }

    /// Waits until `host` may be sent a request, and takes its token.
    pub(crate) async fn acquire(&self, host: &str) {
        while let Some(wait) = self.try_acquire(host) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a token now, or says how long to wait before asking again.
    fn try_acquire(&self, host: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        let burst = self.limit.map_or(1.0, |l| l.burst);
        let bucket = hosts.entry(host.to_owned()).or_insert(Bucket {
            tokens: burst,
            refilled: now,
            held_until: None,
        });
        if let Some(until) = bucket.held_until {
            if until > now {
                return Some(until - now);
            }
            bucket.held_until = None;
        }
        let limit = self.limit?;
        let earned = now.duration_since(bucket.refilled).as_secs_f64() * limit.per_second;
        bucket.tokens = (bucket.tokens + earned).min(limit.burst);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            None
        } else {
            Some(Duration::from_secs_f64(
                (1.0 - bucket.tokens) / limit.per_second,
            ))
        }
    }

    /// Holds `host` for `wait`: what a 429's `Retry-After` asks of every
    /// request to it.
    /// Without a [`RateLimit`] nothing is held: each request waits out its
    /// own 429 only.
    pub(crate) fn hold(&self, host: &str, wait: Duration) {
        if self.limit.is_none() {
            return;
        }
        let until = later(Instant::now(), wait);
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        let bucket = hosts.entry(host.to_owned()).or_insert(Bucket {
            tokens: self.limit.map_or(1.0, |l| l.burst),
            refilled: Instant::now(),
            held_until: None,
        });
        bucket.held_until = Some(bucket.held_until.map_or(until, |held| held.max(until)));
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
