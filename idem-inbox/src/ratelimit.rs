//! An outbound rate limit per destination, for handlers that call
//! rate-limited APIs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket per destination: `rate` requests per second on average,
/// bursts of up to `burst`; and a pause a destination asked for with a 429
/// and `Retry-After`, which holds every caller for that destination.
///
/// Uses tokio's clock, so tests can pause and advance it.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Arc<Mutex<HashMap<String, Bucket>>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    paused_until: Option<Instant>,
}

impl RateLimiter {
    /// `rate` requests per second per destination, bursts of `burst`
    /// (at least 1).
    pub fn new(rate: f64, burst: u32) -> RateLimiter {
        RateLimiter {
            rate: if rate.is_finite() && rate > 0.0 {
                rate
            } else {
                f64::MIN_POSITIVE
            },
            burst: f64::from(burst.max(1)),
            buckets: Arc::default(),
        }
    }

    /// Waits until a request to `destination` may go, and takes its token.
    pub async fn acquire(&self, destination: &str) {
        loop {
            let wait = self.try_acquire(destination);
            match wait {
                None => return,
                Some(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// Takes a token for `destination` if one is free now; otherwise returns
    /// how long until one may be.
    pub fn try_acquire(&self, destination: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(destination.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            refilled: now,
            paused_until: None,
        });
        if let Some(until) = bucket.paused_until {
            if until > now {
                return Some(until - now);
            }
            bucket.paused_until = None;
        }
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.refilled = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            None
        } else {
            Some(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }

    /// Holds every request to `destination` for `retry_after`: what a 429
    /// answer asked for. A shorter pause never shortens a longer one.
    pub fn pause(&self, destination: &str, retry_after: Duration) {
        let until = Instant::now() + retry_after;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(destination.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            refilled: Instant::now(),
            paused_until: None,
        });
        bucket.paused_until = Some(bucket.paused_until.map_or(until, |u| u.max(until)));
        // The bucket drains: requests resume one by one, not as a burst.
        bucket.tokens = 0.0;
        bucket.refilled = until;
    }
}
