//! The client and its builder.

use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;
use reqwest::{IntoUrl, Method};

use crate::limit::Limiter;
use crate::request::{Attempt, RequestBuilder};
use crate::{KeyFormat, RateLimit, RetryPolicy};

/// The header the IETF draft names: `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

pub(crate) type Observer = Arc<dyn Fn(&Attempt) + Send + Sync>;

/// A reqwest client that gives each logical request one idempotency key and
/// retries it only where that is safe.
///
/// Cheap to clone; clones share the connection pool and the rate-limit
/// buckets.
#[derive(Clone)]
pub struct IdemClient {
    pub(crate) http: reqwest::Client,
    pub(crate) policy: RetryPolicy,
    pub(crate) header: HeaderName,
    pub(crate) format: KeyFormat,
    pub(crate) limiter: Limiter,
    pub(crate) observer: Option<Observer>,
}

impl fmt::Debug for IdemClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdemClient")
            .field("policy", &self.policy)
            .field("header", &self.header)
            .field("format", &self.format)
            .field("limiter", &self.limiter)
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for IdemClient {
    fn default() -> IdemClient {
        IdemClient::new()
    }
}

impl IdemClient {
    /// A client with the default [`RetryPolicy`], the `Idempotency-Key`
    /// header in the draft's form and no rate limit, over
    /// `reqwest::Client::new()` (which panics only where a TLS backend
    /// cannot start; use [`from_reqwest`](Self::from_reqwest) to handle
    /// that).
    pub fn new() -> IdemClient {
        IdemClient::from_reqwest(reqwest::Client::new())
    }

    /// A client over a reqwest client configured by the caller (TLS,
    /// proxies, pool, default headers).
    pub fn from_reqwest(http: reqwest::Client) -> IdemClient {
        IdemClient {
            http,
            policy: RetryPolicy::default(),
            header: IDEMPOTENCY_KEY,
            format: KeyFormat::default(),
            limiter: Limiter::new(None),
            observer: None,
        }
    }

    /// The retry policy of every request (a request can override it).
    pub fn with_retry(mut self, policy: RetryPolicy) -> IdemClient {
        self.policy = policy;
        self
    }

    /// Sends the key in `header` instead of `Idempotency-Key`, in `format`.
    pub fn with_key_header(mut self, header: HeaderName, format: KeyFormat) -> IdemClient {
        self.header = header;
        self.format = format;
        self
    }

    /// Limits requests per host; shared by this client's clones made after
    /// this call.
    pub fn with_rate_limit(mut self, limit: RateLimit) -> IdemClient {
        self.limiter = Limiter::new(Some(limit));
        self
    }

    /// Calls `observer` after every attempt, with what happened and how long
    /// the client will wait before the next one: for metrics, logs, and
    /// tests that check the waits without timing them.
    pub fn with_observer(
        mut self,
        observer: impl Fn(&Attempt) + Send + Sync + 'static,
    ) -> IdemClient {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// A request; `POST` and `PATCH` get a fresh random key unless given one.
    pub fn request(&self, method: Method, url: impl IntoUrl) -> RequestBuilder {
        RequestBuilder::new(self.clone(), self.http.request(method, url))
    }

    /// A `POST`, with a fresh random key unless given one.
    pub fn post(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// A `PATCH`, with a fresh random key unless given one.
    pub fn patch(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::PATCH, url)
    }

    /// A `PUT`, without a key unless given one.
    pub fn put(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::PUT, url)
    }

    /// A `DELETE`, without a key unless given one.
    pub fn delete(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::DELETE, url)
    }

    /// A `GET`, without a key; retried only when marked
    /// [`retry_safe`](RequestBuilder::retry_safe).
    pub fn get(&self, url: impl IntoUrl) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// The reqwest client underneath.
    pub fn reqwest(&self) -> &reqwest::Client {
        &self.http
    }
}
