//! One logical request: its key, its body, and the retry loop that sends it.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, StatusCode};
use idem_core::KeyError;
use reqwest::Method;
use serde::Serialize;
use tokio::time::Instant;

use crate::error::{Error, Failure};
use crate::limit::later;
use crate::retry::{classify, retry_after, Verdict};
use crate::{IdemClient, IdempotencyKey, Response, RetryPolicy};

/// What one attempt came to, as an observer sees it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Attempt {
    /// 1 for the first attempt of the logical request.
    pub number: u32,
    /// The key every attempt of the request carries.
    pub key: Option<IdempotencyKey>,
    /// What the attempt got.
    pub outcome: AttemptOutcome,
    /// Whether the response says it is a replay (`Idempotent-Replayed`).
    pub replayed: bool,
    /// From sending the attempt to having its whole response, or failing.
    pub latency: Duration,
    /// The wait the response's `Retry-After` asked for, before the cap.
    pub retry_after: Option<Duration>,
    /// The wait before the next attempt; `None` when this was the last.
    pub retry_in: Option<Duration>,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// A whole response with this status.
    Status(StatusCode),
    /// No whole response within the attempt's timeout.
    TimedOut,
    /// No connection could be made.
    Connect,
    /// The connection broke before the response was whole.
    Broken,
}

#[derive(Debug)]
enum KeyChoice {
    /// A random key for `POST` and `PATCH`, none for other methods.
    ByMethod,
    Given(Result<IdempotencyKey, KeyError>),
    Without,
}

/// A request being built; [`send`](Self::send) sends it, retrying as its
/// key and the policy allow.
#[derive(Debug)]
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder {
    client: IdemClient,
    inner: reqwest::RequestBuilder,
    key: KeyChoice,
    body: Option<Result<Bytes, serde_json::Error>>,
    json: bool,
    retry_safe: bool,
    policy: Option<RetryPolicy>,
}

impl RequestBuilder {
    pub(crate) fn new(client: IdemClient, inner: reqwest::RequestBuilder) -> RequestBuilder {
        RequestBuilder {
            client,
            inner,
            key: KeyChoice::ByMethod,
            body: None,
            json: false,
            retry_safe: false,
            policy: None,
        }
    }

    /// Sends `key` instead of a random one: an id the caller keeps with
    /// the intent (an order id, or a key derived from a job and its step,
    /// such as the `String` that `idem_core`'s `Key::derive` or
    /// `Lease::derive_key` returns for an effect inside idempotent work), so
    /// that a retry after a crash or a takeover of the caller itself is
    /// still deduped. A
    /// key that is not 1–255 visible ASCII characters fails the send with
    /// [`Error::InvalidKey`] before anything is sent.
    pub fn key(mut self, key: impl Into<String>) -> RequestBuilder {
        self.key = KeyChoice::Given(IdempotencyKey::new(key));
        self
    }

    /// Sends this key, already validated.
    pub fn idempotency_key(mut self, key: IdempotencyKey) -> RequestBuilder {
        self.key = KeyChoice::Given(Ok(key));
        self
    }

    /// Sends no key, even for `POST` and `PATCH`. The request is then sent
    /// once unless [`retry_safe`](Self::retry_safe) says otherwise.
    pub fn without_key(mut self) -> RequestBuilder {
        self.key = KeyChoice::Without;
        self
    }

    /// Whether a request without a key may be retried: true for reads and
    /// for writes the caller knows to be idempotent by themselves. Keyed
    /// requests are always retried as the policy says.
    pub fn retry_safe(mut self, safe: bool) -> RequestBuilder {
        self.retry_safe = safe;
        self
    }

    /// The retry policy of this request, replacing the client's (and a
    /// [`timeout`](Self::timeout) set before it).
    pub fn retry(mut self, policy: RetryPolicy) -> RequestBuilder {
        self.policy = Some(policy);
        self
    }

    /// How long each attempt may take before it is retried.
    pub fn timeout(mut self, timeout: Duration) -> RequestBuilder {
        let policy = self
            .policy
            .take()
            .unwrap_or_else(|| self.client.policy.clone());
        self.policy = Some(policy.with_attempt_timeout(timeout));
        self
    }

    /// Adds a header, as reqwest's builder does.
    pub fn header<K, V>(mut self, name: K, value: V) -> RequestBuilder
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.inner = self.inner.header(name, value);
        self
    }

    /// The body, encoded once as JSON, with `Content-Type:
    /// application/json` unless a content type is set.
    pub fn json<T: Serialize + ?Sized>(mut self, body: &T) -> RequestBuilder {
        self.body = Some(serde_json::to_vec(body).map(Bytes::from));
        self.json = true;
        self
    }

    /// The body, as bytes.
    pub fn body(mut self, body: impl Into<Bytes>) -> RequestBuilder {
        self.body = Some(Ok(body.into()));
        self.json = false;
        self
    }

    /// Sends the request: every attempt carries the same key and the same
    /// body bytes. Returns the final response (any status that is not
    /// retried), or why there is none.
    pub async fn send(self) -> Result<Response, Error> {
        let client = self.client;
        let request = self.inner.build().map_err(Error::Build)?;
        let key = match self.key {
            KeyChoice::ByMethod if matches!(*request.method(), Method::POST | Method::PATCH) => {
                Some(IdempotencyKey::random())
            }
            KeyChoice::ByMethod | KeyChoice::Without => None,
            KeyChoice::Given(key) => Some(key?),
        };
        let body = self.body.transpose()?;
        let mut headers = request.headers().clone();
        if let Some(key) = &key {
            headers.insert(client.header.clone(), key.to_header_value(client.format)?);
        }
        if self.json && !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let exchange = Exchange {
            method: request.method().clone(),
            url: request.url().clone(),
            host: host_of(request.url()),
            headers,
            body,
            retryable: key.is_some() || self.retry_safe,
            key,
            policy: self.policy.unwrap_or_else(|| client.policy.clone()),
        };
        exchange.run(&client).await
    }
}

/// The bucket a request draws from: scheme, host and port.
fn host_of(url: &reqwest::Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or(""),
        url.port_or_known_default().unwrap_or(0)
    )
}

/// A request fixed once: what every attempt sends.
struct Exchange {
    method: Method,
    url: reqwest::Url,
    host: String,
    headers: HeaderMap,
    body: Option<Bytes>,
    key: Option<IdempotencyKey>,
    retryable: bool,
    policy: RetryPolicy,
}

/// An attempt's result before the policy looks at it.
enum Sent {
    Answer(Box<Response>),
    Failed(Failure),
}

impl Exchange {
    async fn run(self, client: &IdemClient) -> Result<Response, Error> {
        let started = Instant::now();
        let deadline = later(started, self.policy.max_elapsed);
        let mut number = 0;
        let mut last: Option<Failure> = None;
        loop {
            number += 1;
            client.limiter.acquire(&self.host).await;
            let left = deadline.saturating_duration_since(Instant::now());
            // A rate-limit wait may have used up the budget: no attempt is
            // started that has no time to finish.
            if let (true, Some(failure)) = (left.is_zero(), last.take()) {
                return Err(Error::GaveUp {
                    attempts: number - 1,
                    elapsed: started.elapsed(),
                    last: Box::new(failure),
                });
            }
            let timeout = self.policy.attempt_timeout.min(left);
            let sent_at = Instant::now();
            let sent = self.attempt(client, timeout, number).await?;
            let latency = sent_at.elapsed();

            let (outcome, asked) = match &sent {
                Sent::Answer(response) => (
                    AttemptOutcome::Status(response.status),
                    retry_after(&response.headers, SystemTime::now()),
                ),
                Sent::Failed(Failure::TimedOut(_)) => (AttemptOutcome::TimedOut, None),
                Sent::Failed(Failure::Transport(e)) if e.is_connect() => {
                    (AttemptOutcome::Connect, None)
                }
                Sent::Failed(Failure::Transport(e)) if e.is_timeout() => {
                    (AttemptOutcome::TimedOut, None)
                }
                Sent::Failed(_) => (AttemptOutcome::Broken, None),
            };
            let verdict = match &sent {
                Sent::Answer(response) if self.retryable => {
                    match classify(response.status, &response.body) {
                        // Only a key can have been reused.
                        Verdict::KeyReused if self.key.is_none() => Verdict::Final,
                        verdict => verdict,
                    }
                }
                Sent::Answer(_) => Verdict::Final,
                Sent::Failed(_) => Verdict::Retry,
            };
            let retry_in = (verdict == Verdict::Retry && self.retryable)
                .then(|| self.policy.delay(number, asked))
                .filter(|wait| {
                    number < self.policy.max_attempts && later(Instant::now(), *wait) < deadline
                });
            // The host is held before anyone hears of the 429, so no clone
            // sends to it in between.
            if let (AttemptOutcome::Status(StatusCode::TOO_MANY_REQUESTS), Some(asked)) =
                (outcome, asked)
            {
                client
                    .limiter
                    .hold(&self.host, asked.min(self.policy.retry_after_cap));
            }
            if let Some(observer) = &client.observer {
                observer(&Attempt {
                    number,
                    key: self.key.clone(),
                    outcome,
                    replayed: matches!(&sent, Sent::Answer(r) if r.replayed()),
                    latency,
                    retry_after: asked,
                    retry_in,
                });
            }

            let failure = match (sent, verdict) {
                (Sent::Answer(response), Verdict::Final) => return Ok(*response),
                (Sent::Answer(response), Verdict::KeyReused) => match self.key {
                    Some(key) => return Err(Error::KeyReused { key, response }),
                    None => return Ok(*response),
                },
                (Sent::Answer(response), Verdict::Retry) => Failure::Status(response),
                (Sent::Failed(Failure::Transport(e)), _) if !self.retryable => {
                    return Err(Error::Transport(e))
                }
                (Sent::Failed(failure), _) => failure,
            };
            let Some(wait) = retry_in else {
                return Err(Error::GaveUp {
                    attempts: number,
                    elapsed: started.elapsed(),
                    last: Box::new(failure),
                });
            };
            tracing::debug!(
                url = %self.url, key = ?self.key.as_ref().map(IdempotencyKey::as_str),
                attempt = number, error = %failure, ?wait, "retrying"
            );
            last = Some(failure);
            tokio::time::sleep(wait).await;
        }
    }

    /// Sends one attempt and reads its whole response within `timeout`.
    async fn attempt(
        &self,
        client: &IdemClient,
        timeout: Duration,
        number: u32,
    ) -> Result<Sent, Error> {
        let mut request = reqwest::Request::new(self.method.clone(), self.url.clone());
        *request.headers_mut() = self.headers.clone();
        if let Some(body) = &self.body {
            *request.body_mut() = Some(body.clone().into());
        }
        let exchange = async {
            let response = client.http.execute(request).await?;
            let (status, headers, url) = (
                response.status(),
                response.headers().clone(),
                response.url().clone(),
            );
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>(Response {
                status,
                headers,
                body,
                url,
                key: self.key.clone(),
                attempts: number,
            })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(response)) => Ok(Sent::Answer(Box::new(response))),
            Ok(Err(e)) if e.is_builder() => Err(Error::Build(e)),
            Ok(Err(e)) if e.is_timeout() => Ok(Sent::Failed(Failure::TimedOut(timeout))),
            Ok(Err(e)) => Ok(Sent::Failed(Failure::Transport(e))),
            Err(_) => Ok(Sent::Failed(Failure::TimedOut(timeout))),
        }
    }
}
