//! When to retry and how long to wait: the budget, full-jitter backoff and
//! `Retry-After`.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use idem_core::backoff::Backoff;

/// How hard one logical request is retried.
///
/// A request is given up on when it has made
/// [`max_attempts`](Self::with_max_attempts) attempts or when the next wait
/// would end past [`max_elapsed`](Self::with_max_elapsed) from its start,
/// whichever comes first: a wait that cannot be followed by an attempt is
/// not waited out. Every attempt's timeout is also cut to what is left of
/// `max_elapsed`.
///
/// Between attempts it waits a full-jitter backoff, a uniformly random time
/// in `[0, min(max_backoff, base × 2^(attempt-1))]` (the core's
/// [`Backoff`], the AWS "full jitter" scheme, which spreads a crowd of
/// retrying clients the most), or what the server's `Retry-After` asks,
/// capped at [`retry_after_cap`](Self::with_retry_after_cap), whichever is
/// longer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) max_elapsed: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) retry_after_cap: Duration,
    pub(crate) attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    /// 5 attempts within 30 s, backoff from 100 ms up to 5 s, `Retry-After`
    /// honoured up to 30 s, 10 s per attempt.
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            max_elapsed: Duration::from_secs(30),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
            retry_after_cap: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// One attempt and no retry.
    pub fn never() -> RetryPolicy {
        RetryPolicy::default().with_max_attempts(1)
    }

    /// At most `attempts` attempts, the first included (at least 1).
    pub fn with_max_attempts(mut self, attempts: u32) -> RetryPolicy {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The time budget of one logical request, from its first attempt.
    pub fn with_max_elapsed(mut self, budget: Duration) -> RetryPolicy {
        self.max_elapsed = budget;
        self
    }

    /// The backoff's first ceiling and its largest one.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> RetryPolicy {
        self.backoff = Backoff::new(base, max.max(base));
        self
    }

    /// The longest wait a `Retry-After` may ask for; a longer one is cut to
    /// this. A server asking for more than the budget leaves is given up on
    /// at once.
    pub fn with_retry_after_cap(mut self, cap: Duration) -> RetryPolicy {
        self.retry_after_cap = cap;
        self
    }

    /// How long one attempt may take, the response body included, before it
    /// counts as timed out (and is retried, when the request may be).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> RetryPolicy {
        self.attempt_timeout = timeout;
        self
    }

    /// The wait after failed attempt number `attempt` (1-based): full-jitter
    /// backoff, or the capped `Retry-After` when that is longer.
    pub(crate) fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let jittered = self.backoff.delay(attempt);
        match retry_after {
            Some(asked) => jittered.max(asked.min(self.retry_after_cap)),
            None => jittered,
        }
    }
}

/// What a response's status means for a request that may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The answer to keep: success, or a final refusal.
    Final,
    /// Worth another attempt after a wait.
    Retry,
    /// 422 because the key was used with another request.
    KeyReused,
}

/// Classifies a response to a request that carried a key (or was marked
/// safe to retry): 5xx but 501, 408, 429 and 409 "in progress" are retried;
/// 422 saying the key was reused is [`Verdict::KeyReused`]; the rest is final.
pub(crate) fn classify(status: StatusCode, body: &[u8]) -> Verdict {
    match status {
        StatusCode::NOT_IMPLEMENTED => Verdict::Final,
        s if s.is_server_error() => Verdict::Retry,
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => Verdict::Retry,
        // A 409 to a keyed request is the draft's "a request with this key
        // is outstanding", unless the server says the request ran and its
        // answer is lost (idem's `not-replayable`): retrying that cannot help.
        StatusCode::CONFLICT if problem_type_ends_with(body, "not-replayable") => Verdict::Final,
        StatusCode::CONFLICT => Verdict::Retry,
        StatusCode::UNPROCESSABLE_ENTITY if is_key_reuse(body) => Verdict::KeyReused,
        _ => Verdict::Final,
    }
}

/// Whether a 422 body says the key was used with another request: idem's
/// `mismatch` problem, or a problem whose type or title names idempotency
/// (the IETF draft's example). A 422 that says neither is the API refusing
/// the request itself, such as a failed validation.
fn is_key_reuse(body: &[u8]) -> bool {
    let Some(problem) = problem(body) else {
        return false;
    };
    let field = |name: &str| {
        problem
            .get(name)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_ascii_lowercase()
    };
    let (kind, title) = (field("type"), field("title"));
    kind.ends_with("/mismatch") || kind.contains("idempotency") || title.contains("idempotency")
}

fn problem_type_ends_with(body: &[u8], suffix: &str) -> bool {
    problem(body)
        .and_then(|p| p.get("type")?.as_str().map(|t| t.ends_with(suffix)))
        .unwrap_or(false)
}

fn problem(body: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_slice(body).ok()? {
        serde_json::Value::Object(map) => Some(map),
        _ => None,
    }
}

/// The wait a `Retry-After` header asks for: delay-seconds or an HTTP date
/// (RFC 9110 §10.2.3). A date in the past asks for no wait; a value that is
/// neither is ignored.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with_retry_after(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::RETRY_AFTER,
            HeaderValue::from_str(value).unwrap(),
        );
        headers
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            retry_after(&with_retry_after("7"), now),
            Some(Duration::from_secs(7))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(42));
        assert_eq!(
            retry_after(&with_retry_after(&later), now),
            Some(Duration::from_secs(42))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(42));
        assert_eq!(
            retry_after(&with_retry_after(&past), now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&with_retry_after("soon"), now), None);
        assert_eq!(retry_after(&with_retry_after("-3"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn backoff_is_full_jitter_under_a_doubling_ceiling() {
        let policy = RetryPolicy::default()
            .with_backoff(Duration::from_millis(10), Duration::from_millis(80));
        for attempt in 1..=8u32 {
            let ceiling =
                Duration::from_millis(10 * 2u64.pow(attempt - 1)).min(Duration::from_millis(80));
            let waits: Vec<Duration> = (0..200).map(|_| policy.delay(attempt, None)).collect();
            assert!(
                waits.iter().all(|w| *w <= ceiling),
                "attempt {attempt}: {waits:?}"
            );
            // Full jitter spreads over the whole range, not only near the top.
            assert!(waits.iter().any(|w| *w < ceiling / 2), "attempt {attempt}");
        }
        assert!(policy.delay(u32::MAX, None) <= Duration::from_millis(80));
    }

    #[test]
    fn retry_after_is_honoured_up_to_its_cap() {
        let policy = RetryPolicy::default()
            .with_backoff(Duration::from_millis(1), Duration::from_millis(1))
            .with_retry_after_cap(Duration::from_secs(5));
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(3600))),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn statuses_are_classified_as_the_policy_says() {
        let mismatch = br#"{"type":"tag:idem-rs.github.io,2025:problem/mismatch","status":422}"#;
        let draft = br#"{"type":"https://developer.example.com/idempotency","title":"Idempotency-Key is already used"}"#;
        let validation = br#"{"type":"tag:example.com,2025:problem/invalid-amount","status":422}"#;
        let lost = br#"{"type":"tag:idem-rs.github.io,2025:problem/not-replayable"}"#;
        assert_eq!(classify(StatusCode::CREATED, b""), Verdict::Final);
        assert_eq!(
            classify(StatusCode::SERVICE_UNAVAILABLE, b""),
            Verdict::Retry
        );
        assert_eq!(
            classify(StatusCode::INTERNAL_SERVER_ERROR, b""),
            Verdict::Retry
        );
        assert_eq!(classify(StatusCode::NOT_IMPLEMENTED, b""), Verdict::Final);
        assert_eq!(classify(StatusCode::TOO_MANY_REQUESTS, b""), Verdict::Retry);
        assert_eq!(classify(StatusCode::CONFLICT, b""), Verdict::Retry);
        assert_eq!(classify(StatusCode::CONFLICT, lost), Verdict::Final);
        assert_eq!(
            classify(StatusCode::UNPROCESSABLE_ENTITY, mismatch),
            Verdict::KeyReused
        );
        assert_eq!(
            classify(StatusCode::UNPROCESSABLE_ENTITY, draft),
            Verdict::KeyReused
        );
        assert_eq!(
            classify(StatusCode::UNPROCESSABLE_ENTITY, validation),
            Verdict::Final
        );
        assert_eq!(
            classify(StatusCode::UNPROCESSABLE_ENTITY, b"not json"),
            Verdict::Final
        );
        assert_eq!(classify(StatusCode::BAD_REQUEST, b""), Verdict::Final);
        assert_eq!(classify(StatusCode::NOT_FOUND, b""), Verdict::Final);
    }
}
