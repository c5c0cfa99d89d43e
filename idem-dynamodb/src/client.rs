//! One signed call to DynamoDB's JSON API, its throttling retried, and the
//! clock the store stamps deadlines with.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::store::StoreError;
use rand::Rng;
use serde_json::Value;

use crate::error::DynamoError;
use crate::sigv4::{self, Credentials};
use crate::BACKEND;

/// Error types DynamoDB uses for a request it refused before doing
/// anything, so that sending it again is safe.
const THROTTLED: [&str; 3] = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
];

/// The client clock is corrected to the service's once they disagree by
/// more than this (see the crate docs, *Deadlines and clocks*).
pub(crate) const DEFAULT_SKEW_ALLOWANCE: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) http: reqwest::Client,
    pub(crate) endpoint: reqwest::Url,
    host: String,
    pub(crate) region: String,
    pub(crate) credentials: Credentials,
    pub(crate) retries: AtomicU32,
    pub(crate) clock: Clock,
}

impl Client {
    pub(crate) fn new(
        http: reqwest::Client,
        endpoint: reqwest::Url,
        region: String,
        credentials: Credentials,
    ) -> Result<Client, StoreError> {
        let host = match (endpoint.host_str(), endpoint.port()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            (None, _) => {
                return Err(StoreError::config(
                    BACKEND,
                    format!("the endpoint {endpoint} names no host"),
                ))
            }
        };
        Ok(Client {
            http,
            endpoint,
            host,
            region,
            credentials,
            retries: AtomicU32::new(4),
            clock: Clock::new(DEFAULT_SKEW_ALLOWANCE),
        })
    }

    /// Calls `operation` with the body `body(now)` builds, `now` being
    /// the store's clock in milliseconds; a throttled call is built again
    /// with a new `now` and sent again, up to `retries` times.
    pub(crate) async fn call(
        &self,
        operation: &str,
        body: impl Fn(i64) -> Value,
    ) -> Result<Value, DynamoError> {
        let mut attempt = 0;
        loop {
            match self.send(operation, &body(self.clock.now_ms())).await {
                Err(DynamoError::Service { kind, .. })
                    if attempt < self.retries.load(Ordering::Relaxed)
                        && THROTTLED.contains(&kind.as_str()) =>
                {
                    attempt += 1;
                    // Full jitter on 25 ms doubling, at most 800 ms.
                    let cap = 25u64 << attempt.min(5);
                    let wait = rand::rng().random_range(cap / 2..=cap);
                    tracing::debug!(operation, attempt, wait, "DynamoDB throttled the call");
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
                other => return other,
            }
        }
    }

    async fn send(&self, operation: &str, body: &Value) -> Result<Value, DynamoError> {
        let target = format!("DynamoDB_20120810.{operation}");
        let bytes = serde_json::to_vec(body).expect("a JSON value always encodes");
        let signed = sigv4::sign(
            &self.credentials,
            &self.region,
            &self.host,
            &target,
            &bytes,
            SystemTime::now(),
        );
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header("content-type", sigv4::CONTENT_TYPE)
            .header("x-amz-target", &target)
            .header("x-amz-date", &signed.amz_date)
            .header("authorization", &signed.authorization);
        if let Some(token) = &signed.security_token {
            request = request.header("x-amz-security-token", token);
        }
        let sent = unix_ms(SystemTime::now());
        let response = request
            .body(bytes)
            .send()
            .await
            .map_err(DynamoError::Transport)?;
        let received = unix_ms(SystemTime::now());
        if let Some(date) = response
            .headers()
            .get("date")
            .and_then(|d| d.to_str().ok())
            .and_then(|d| httpdate::parse_http_date(d).ok())
        {
            self.clock.observe(unix_ms(date), sent, received);
        }
        let status = response.status();
        let text = response.bytes().await.map_err(DynamoError::Transport)?;
        let value: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&text).map_err(|e| DynamoError::Reply {
                status: status.as_u16(),
                problem: e.to_string(),
            })?
        };
        if status.is_success() {
            return Ok(value);
        }
        let kind = value
            .get("__type")
            .and_then(Value::as_str)
            .map(|t| t.rsplit('#').next().unwrap_or(t).to_owned())
            .unwrap_or_else(|| format!("HTTP {status}"));
        let message = value
            .get("message")
            .or_else(|| value.get("Message"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Err(DynamoError::Service {
            status: status.as_u16(),
            kind,
            message,
            item: value.get("Item").cloned(),
        })
    }
}

/// The store's clock: the client's, corrected to the service's once they
/// disagree by more than the allowance.
#[derive(Debug)]
pub(crate) struct Clock {
    offset_ms: AtomicI64,
    allowance_ms: AtomicI64,
}

impl Clock {
    pub(crate) fn new(allowance: Duration) -> Clock {
        Clock {
            offset_ms: AtomicI64::new(0),
            allowance_ms: AtomicI64::new(allowance.as_millis() as i64),
        }
    }

    pub(crate) fn set_allowance(&self, allowance: Duration) {
        self.allowance_ms
            .store(allowance.as_millis() as i64, Ordering::Relaxed);
    }

    pub(crate) fn now_ms(&self) -> i64 {
        unix_ms(SystemTime::now()) + self.offset_ms.load(Ordering::Relaxed)
    }

    /// How far the store's clock is set from the client's.
    pub(crate) fn offset(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Learns from a reply stamped `date` (whole seconds, so the service's
    /// time was within `[date, date + 1 s)` when it answered) that was sent
    /// and received at those client times.
    pub(crate) fn observe(&self, date_ms: i64, sent_ms: i64, received_ms: i64) {
        let estimate = date_ms + 500 - (sent_ms + received_ms) / 2;
        let current = self.offset_ms.load(Ordering::Relaxed);
        if (estimate - current).abs() > self.allowance_ms.load(Ordering::Relaxed) {
            tracing::warn!(
                offset_ms = estimate,
                "this machine's clock is off DynamoDB's; deadlines follow DynamoDB's"
            );
            self.offset_ms.store(estimate, Ordering::Relaxed);
        }
    }
}

pub(crate) fn unix_ms(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_within_the_allowance_is_left_alone() {
        let clock = Clock::new(Duration::from_secs(1));
        // Sent at 10.200 s, received at 10.300 s, stamped 10 s: 0 ms off.
        clock.observe(10_000, 10_200, 10_300);
        assert_eq!(clock.offset(), 0);
        clock.observe(9_000, 10_200, 10_300);
        assert_eq!(clock.offset(), 0, "750 ms behind is within 1 s");
    }

    #[test]
    fn a_clock_past_the_allowance_follows_the_service() {
        let clock = Clock::new(Duration::from_secs(1));
        // The service says 310 s while this machine says 10 s.
        clock.observe(310_000, 10_000, 10_000);
        assert_eq!(clock.offset(), 300_500);
        // Later replies within the allowance of that offset keep it.
        clock.observe(311_000, 10_900, 10_900);
        assert_eq!(clock.offset(), 300_500);
    }
}
