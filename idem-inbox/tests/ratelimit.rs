//! The outbound token bucket, on tokio's paused clock.

use std::time::Duration;

use idem_http::ratelimit::RateLimiter;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn requests_beyond_the_burst_wait_for_the_rate() {
    let limiter = RateLimiter::new(10.0, 5);
    let began = Instant::now();
    for _ in 0..5 {
        limiter.acquire("api").await;
    }
    assert_eq!(began.elapsed(), Duration::ZERO, "the burst waited");
    for _ in 0..10 {
        limiter.acquire("api").await;
    }
    let waited = began.elapsed();
    assert!(
        waited >= Duration::from_millis(990) && waited <= Duration::from_millis(1010),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn destinations_have_buckets_of_their_own() {
    let limiter = RateLimiter::new(1.0, 1);
    limiter.acquire("a").await;
    let began = Instant::now();
    limiter.acquire("b").await;
    assert_eq!(began.elapsed(), Duration::ZERO);
    assert!(limiter.try_acquire("a").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_429_pause_holds_every_caller_for_what_it_asked() {
    let limiter = RateLimiter::new(100.0, 10);
    limiter.pause("api", Duration::from_secs(3));
    limiter.pause("api", Duration::from_secs(1));
    let began = Instant::now();
    limiter.acquire("api").await;
    assert!(
        began.elapsed() >= Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
    assert!(began.elapsed() <= Duration::from_millis(3020));
    assert_eq!(limiter.try_acquire("other"), None);
}
