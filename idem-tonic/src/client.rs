//! `RetryLayer`: one key per logical call, kept across its retries, and
//! retries only where they are safe.

use std::collections::HashSet;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use idem_core::backoff::Backoff;
use tonic::Code;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::BoxError;
use crate::protocol::{self, KEY};

/// Makes unary gRPC calls through a tonic `Channel` (or any gRPC client
/// service) safe to retry: each call to a named method gets one
/// idempotency key, kept across its retries, and is retried only where
/// that is safe with a key the server honours (an
/// [`IdempotencyLayer`](crate::IdempotencyLayer)):
///
/// * the connection failed before an answer arrived (the channel's error;
///   the server may or may not have run the call, which the key makes
///   safe to find out),
/// * `UNAVAILABLE`, after a backoff with full jitter (idem-client's:
///   up to 100 ms after the first failure, doubling, capped at 5 s),
/// * `ABORTED` with `grpc-retry-pushback-ms` (the key is in flight), after
///   the pushback, as gRFC A6 has it (capped by
///   [`with_max_pushback`](Self::with_max_pushback)).
///
/// Anything else is the call's answer, including `ABORTED` without a
/// pushback. As in gRFC A6, a call is retried only while no answer has
/// begun: an answer whose headers arrived is returned as it is, so the
/// answer is streamed, never buffered.
///
/// A call that already carries the key metadata entry keeps its key (the
/// caller names the operation, say from an order id); any other gets a
/// random UUID. The request message is held in memory to be sent again,
/// so only unary methods may be named: [`method`](Self::method) by full
/// path, or [`service`](Self::service) for every method of a service whose
/// methods are all unary. Calls to other methods pass through untouched.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_tonic::RetryLayer;
/// use tower::ServiceBuilder;
///
/// let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect_lazy();
/// let channel = ServiceBuilder::new()
///     .layer(RetryLayer::new().method("/payments.Payments/Charge"))
///     .service(channel);
/// // PaymentsClient::new(channel).charge(…) now retries safely.
/// # let _ = channel;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RetryLayer {
    config: Arc<ClientConfig>,
}

#[derive(Clone)]
struct ClientConfig {
    methods: HashSet<String>,
    services: HashSet<String>,
    key: HeaderName,
    attempts: u32,
    backoff: Backoff,
    max_pushback: Duration,
    wait: Option<HeaderValue>,
}

impl fmt::Debug for RetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        f.debug_struct("RetryLayer")
            .field("methods", &config.methods)
            .field("services", &config.services)
            .field("key", &config.key)
            .field("attempts", &config.attempts)
            .field("backoff", &config.backoff)
            .field("max_pushback", &config.max_pushback)
            .field("wait", &config.wait)
            .finish()
    }
}

impl Default for RetryLayer {
    fn default() -> Self {
        RetryLayer::new()
    }
}

impl RetryLayer {
    /// A layer that protects no method yet: up to 5 attempts, idem-client's
    /// backoff (100 ms doubling to 5 s), pushbacks of at most 10 s.
    pub fn new() -> Self {
        RetryLayer {
            config: Arc::new(ClientConfig {
                methods: HashSet::new(),
                services: HashSet::new(),
                key: KEY,
                attempts: 5,
                backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(5)),
                max_pushback: Duration::from_secs(10),
                wait: None,
            }),
        }
    }

    fn map(mut self, change: impl FnOnce(&mut ClientConfig)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Protects the unary method at `path` (`/package.Service/Method`).
    pub fn method(self, path: impl Into<String>) -> Self {
        self.map(|config| {
            config.methods.insert(path.into());
        })
    }

    /// Protects every method of the service `name` (`package.Service`),
    /// all of which must be unary.
    pub fn service(self, name: impl Into<String>) -> Self {
        self.map(|config| {
            config.services.insert(name.into());
        })
    }

    /// Sends the key in this metadata entry instead of `idempotency-key`.
    pub fn with_metadata_key(self, name: HeaderName) -> Self {
        self.map(|config| config.key = name)
    }

    /// The most attempts a call makes, the first included (at least 1).
    pub fn with_max_attempts(self, attempts: u32) -> Self {
        self.map(|config| config.attempts = attempts.max(1))
    }

    /// The backoff between attempts that failed without a pushback.
    pub fn with_backoff(self, backoff: Backoff) -> Self {
        self.map(|config| config.backoff = backoff)
    }

    /// Asks the server, with `prefer: wait=N` metadata (whole seconds,
    /// rounded up), to wait up to `wait` for the answer of a key in flight
    /// rather than answer `ABORTED`: what a retry after a cut connection
    /// wants, as the pushback is the running call's whole lease left.
    pub fn with_wait(self, wait: Duration) -> Self {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let value = HeaderValue::try_from(format!("wait={secs}")).expect("ASCII digits");
        self.map(|config| config.wait = (secs > 0).then_some(value))
    }

    /// The longest pushback the layer waits for; a longer one is answered
    /// to the caller as it is (the `ABORTED` status).
    pub fn with_max_pushback(self, max: Duration) -> Self {
        self.map(|config| config.max_pushback = max)
    }
}

impl ClientConfig {
    fn protects(&self, path: &str) -> bool {
        if self.methods.contains(path) {
            return true;
        }
        let service = path
            .strip_prefix('/')
            .and_then(|rest| rest.rsplit_once('/'))
            .map(|(service, _)| service);
        service.is_some_and(|service| self.services.contains(service))
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = RetryService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`RetryLayer`] wraps around a gRPC client service.
#[derive(Clone)]
pub struct RetryService<S> {
    inner: S,
    config: Arc<ClientConfig>,
}

impl<S: fmt::Debug> fmt::Debug for RetryService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The future a [`RetryService`] returns. It is `Send`.
pub type RetryFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send + 'static>>;

impl<S, ResBody> Service<Request<tonic::body::Body>> for RetryService<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = RetryFuture<Response<ResBody>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !self.config.protects(request.uri().path()) {
            return Box::pin(inner.call(request));
        }
        Box::pin(retry(inner, Arc::clone(&self.config), request))
    }
}

async fn retry<S, ResBody>(
    mut inner: S,
    config: Arc<ClientConfig>,
    request: Request<tonic::body::Body>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<tonic::body::Body>, Response = Response<ResBody>>,
{
    let (mut parts, body) = request.into_parts();
    if !parts.headers.contains_key(&config.key) {
        let key = uuid::Uuid::new_v4().simple().to_string();
        let value = HeaderValue::try_from(key).expect("a UUID is a header value");
        parts.headers.insert(config.key.clone(), value);
    }
    if let Some(wait) = &config.wait {
        parts.headers.insert(idem_http::PREFER, wait.clone());
    }
    // The message is sent again on a retry, so it is read once, whole.
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(status) => {
            // Encoding the message failed: send that failure on, once.
            let request = Request::from_parts(parts, tonic::body::Body::new(Failed(Some(status))));
            return inner.call(request).await;
        }
    };
    let mut attempt = 1;
    loop {
        let mut request = Request::new(tonic::body::Body::new(Full::new(body.clone())));
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = parts.uri.clone();
        *request.version_mut() = parts.version;
        *request.headers_mut() = parts.headers.clone();
        *request.extensions_mut() = parts.extensions.clone();
        if attempt > 1 {
            poll_fn(|cx| inner.poll_ready(cx)).await?;
        }
        let last = attempt >= config.attempts;
        let wait = match inner.call(request).await {
            Err(_) if !last => config.backoff.delay(attempt),
            Err(error) => return Err(error),
            Ok(response) if last => return Ok(response),
            Ok(response) => match retry_after(&config, &response, attempt) {
                Some(wait) => wait,
                None => return Ok(response),
            },
        };
        tracing::debug!(
            attempt,
            ?wait,
            path = parts.uri.path(),
            "retrying a gRPC call under its idempotency key"
        );
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

/// How long to wait before the next attempt, if this answer may be
/// retried: a trailers-only `UNAVAILABLE`, or `ABORTED` with a pushback.
fn retry_after<B>(config: &ClientConfig, response: &Response<B>, attempt: u32) -> Option<Duration> {
    // A trailers-only answer carries its status in the headers; an answer
    // with a message has begun and is never retried.
    if !response.headers().contains_key("grpc-status") {
        return None;
    }
    match protocol::status_of(response.headers(), None) {
        Code::Unavailable => Some(config.backoff.delay(attempt)),
        Code::Aborted => protocol::pushback(response.headers())
            .filter(|pushback| *pushback <= config.max_pushback),
        _ => None,
    }
}

/// A body that fails once with the error of the message it stands for.
struct Failed(Option<tonic::Status>);

impl Body for Failed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(self.get_mut().0.take().map(|status| Err(status.into())))
    }
}
