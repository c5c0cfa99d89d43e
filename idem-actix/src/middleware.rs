//! `IdempotencyMiddleware`: the settings, the actix `Transform`, and the
//! service that hands each request to idem-http's exchange.

use std::cell::RefCell;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::{BodyStream, BoxBody, MessageBody};
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::{HttpMessage, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use idem_core::store::Store;
use idem_core::Idempotent;
use idem_http::{Admission, Options, Panicked, Problem, Reply, Uncancelled};

use crate::body::Body;

type ScopeFn = dyn Fn(&ServiceRequest) -> Option<String> + Send + Sync;

/// Makes `POST` and `PATCH` handlers safe to retry with an
/// `Idempotency-Key` header: the handler runs at most once per key and
/// every retry gets its recorded response back, with
/// `Idempotent-Replayed: true`.
///
/// Every option, status and problem document is the same as
/// `idem_tower::IdempotencyLayer`'s (see there for the full table),
/// including what the fingerprint covers (`with_fingerprint_policy`,
/// `with_route_fingerprint_policy`) and where the key comes from
/// (`with_key_source`: a JSON Pointer into the body, a function over the
/// request).
///
/// ```
/// use idem_actix::IdempotencyMiddleware;
/// use idem_core::MemoryStore;
/// use idem_http::{FingerprintPolicy, KeySource};
///
/// let middleware = IdempotencyMiddleware::new(MemoryStore::new())
///     .with_fingerprint_policy(FingerprintPolicy::new().ignore_query_params(["attempt"]))
///     .with_key_source(KeySource::json_pointer("/request_id"));
/// # let _ = middleware;
/// ```
///
/// The exchange runs in the request's own future; if a client disconnects and
/// actix drops that future, what is left of the claim, the handler and its
/// recording goes on in a local task (`actix_web::rt::spawn`) on the same
/// worker, so a hang-up cancels none of them.
#[derive(Clone)]
pub struct IdempotencyMiddleware {
    options: Options,
    scope: Option<Arc<ScopeFn>>,
}

impl fmt::Debug for IdempotencyMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyMiddleware")
            .field("options", &self.options)
            .field("scope", &self.scope.as_ref().map(|_| "Fn(&ServiceRequest)"))
            .finish()
    }
}

impl IdempotencyMiddleware {
    /// Protects handlers with `store`, with a 60 s lease and a 24 h
    /// retention. Accepts an `Arc<dyn Store>` as well as a store by value.
    pub fn new<S: Store>(store: S) -> Self {
        IdempotencyMiddleware::from_idempotent(Idempotent::new(store))
    }

    /// Protects handlers with an [`Idempotent`] whose lease, retention and
    /// namespace are already set.
    pub fn from_idempotent(idem: Idempotent) -> Self {
        IdempotencyMiddleware::from_options(Options::from_idempotent(idem))
    }

    /// Protects handlers with the protocol's [`Options`].
    pub fn from_options(options: Options) -> Self {
        IdempotencyMiddleware {
            options,
            scope: None,
        }
    }

    fn map_options(mut self, change: impl FnOnce(Options) -> Options) -> Self {
        self.options = change(self.options);
        self
    }

    idem_http::option_setters!();

    /// Gives each tenant or principal its own keys: `f` reads the scope from
    /// the request. `None` or `""` leaves the request to the default: its
    /// caller's `Authorization` header, hashed ([`idem_http::Caller`]), or
    /// one scope for all with
    /// [`shared_across_callers`](Self::shared_across_callers). A scope over
    /// 255 bytes or with a control character is refused with 400.
    pub fn with_scope<F>(mut self, f: F) -> Self
    where
        F: Fn(&ServiceRequest) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Some(Arc::new(f));
        self
    }
}

impl<S, B> Transform<S, ServiceRequest> for IdempotencyMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = actix_web::Error;
    type Transform = IdempotencyService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(IdempotencyService {
            inner: Rc::new(service),
            config: Rc::new(self.clone()),
        }))
    }
}

/// The service [`IdempotencyMiddleware`] wraps around a handler.
pub struct IdempotencyService<S> {
    inner: Rc<S>,
    config: Rc<IdempotencyMiddleware>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

impl<S, B> Service<ServiceRequest> for IdempotencyService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = actix_web::Error;
    type Future = LocalFuture<Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(inner);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        Box::pin(handle(
            Rc::clone(&self.inner),
            Rc::clone(&self.config),
            request,
        ))
    }
}

async fn handle<S, B>(
    inner: Rc<S>,
    config: Rc<IdempotencyMiddleware>,
    mut request: ServiceRequest,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    let options = &config.options;
    let method = Method::from_bytes(request.method().as_str().as_bytes()).unwrap_or_default();
    let headers = headers_of(request.headers());
    let key = match options.admit(&method, &headers) {
        Admission::Protect(key) => Some(key),
        Admission::KeyInBody => None,
        Admission::Refuse(problem) => return Ok(reply(request.request(), problem.into_response())),
        _ => return Ok(inner.call(request).await?.map_into_boxed_body()),
    };
    let limit = options.max_request_body();
    let body = match read_body(request.take_payload(), limit).await {
        Ok(body) => body,
        Err(problem) => return Ok(reply(request.request(), problem.into_response())),
    };
    // The fingerprint and the key read the path and query alone.
    let path_and_query = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let uri = Uri::try_from(path_and_query).unwrap_or_default();
    let key = match key {
        Some(key) => key,
        None => match options.admit_body(&method, &uri, &headers, &body) {
            Admission::Protect(key) => key,
            Admission::Refuse(problem) => {
                return Ok(reply(request.request(), problem.into_response()))
            }
            _ => {
                request.set_payload(Payload::from(body));
                return Ok(inner.call(request).await?.map_into_boxed_body());
            }
        },
    };
    // Without the application's scope the exchange scopes the key by the
    // request's caller.
    let idem = match config.scope.as_ref().and_then(|extract| extract(&request)) {
        Some(scope) => options.idempotent().scoped(scope),
        None => options.idempotent().clone(),
    };
    let fingerprint = options.fingerprint(&method, &uri, &headers, &body);
    let context = options.request_context(&headers);
    request.set_payload(Payload::from(body));
    // The request goes to the handler whole: actix routes it only while no
    // clone of it exists. The response is built on the handler's request,
    // or on this one when the handler never ran.
    let pending = Rc::new(RefCell::new(Some(request)));
    let answered = Rc::new(RefCell::new(None::<HttpRequest>));
    let (to_handler, from_handler) = (Rc::clone(&pending), Rc::clone(&answered));
    // From the claim on, nothing may be cancelled: a client that hangs up
    // while the claim is in flight must not leave a claimed key that nobody
    // will run or release, and one that hangs up mid-handler must not
    // cancel the handler or its recording. The exchange runs in this
    // future, and goes on in a local task if this future is dropped before
    // it is done.
    let exchange = Uncancelled::new(
        async move {
            let handler = || async move {
                let request = to_handler.borrow_mut().take();
                let request = request.ok_or_else(|| internal("the request was already handled"))?;
                let (request, response) = inner.call(request).await?.into_parts();
                *from_handler.borrow_mut() = Some(request);
                Ok::<_, actix_web::Error>(to_http(response.map_into_boxed_body()))
            };
            config
                .options
                .exchange_with(&idem, &key, fingerprint, context, handler)
                .await
        },
        finish_locally,
    );
    let response = match exchange.await {
        Ok(Ok(Reply::Whole(response))) => from_http(response.map(BoxBody::new)),
        Ok(Ok(Reply::Handler(response))) => from_http(response.map(|body| body.0)),
        Ok(Ok(Reply::Streamed(response, recording))) => {
            if let Some(recording) = recording {
                // It outlives the request: a client that hangs up does not
                // stop the recording.
                drop(actix_web::rt::spawn(recording.run()));
            }
            let frames = |frames: idem_http::Frames| {
                let frames = frames.map(|frame| frame.map_err(std::io::Error::other));
                BoxBody::new(BodyStream::new(frames))
            };
            from_http(response.map(frames))
        }
        Ok(Ok(_)) => return Err(internal("unknown reply")),
        Ok(Err(error)) => return Err(error),
        Err(Panicked) => {
            // The side effect may have happened, so the key stays claimed
            // until its lease lapses rather than released.
            tracing::error!("the handler panicked; the key stays claimed until its lease lapses");
            return Err(internal("the handler failed"));
        }
    };
    let request = answered
        .take()
        .or_else(|| pending.take().map(|r| r.into_parts().0));
    match request {
        Some(request) => Ok(ServiceResponse::new(request, response)),
        None => Err(internal("the request was lost")),
    }
}

/// Finishes what is left of a dropped exchange in a local task
/// (`actix_web::rt::spawn`) on the worker it ran on, which needs no `Send`.
/// A spawn that cannot happen is logged rather than a panic in a
/// destructor; the key then stays claimed until its lease lapses.
fn finish_locally<F>(rest: Pin<Box<F>>)
where
    F: Future + 'static,
{
    if std::thread::panicking() {
        // Spawning could panic again, which aborts; the key stays
        // claimed until its lease lapses.
        tracing::error!("an exchange was dropped while its thread unwinds; its key stays claimed until its lease lapses");
        return;
    }
    // actix-web drops a request's future on the worker that ran it,
    // inside its local task set; a runtime shutting down may not be
    // able to take a task any more, and that must not become a panic
    // in a destructor.
    let spawned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(actix_web::rt::spawn(rest));
    }));
    if spawned.is_err() {
        tracing::error!("an exchange was dropped outside the actix runtime; its key stays claimed until its lease lapses");
    }
}

/// A 500 problem, as an error: actix sends its response as it is.
fn internal(why: &'static str) -> actix_web::Error {
    let response = from_http(Problem::Internal(why).into_response().map(BoxBody::new));
    actix_web::error::InternalError::from_response(why, response).into()
}

/// Reads the request body, refusing one over `limit` bytes.
async fn read_body(mut payload: Payload, limit: usize) -> Result<Bytes, Problem> {
    let mut read = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|error| {
            tracing::debug!(%error, "request body could not be read");
            Problem::UnreadableBody
        })?;
        if read.len() + chunk.len() > limit {
            return Err(Problem::BodyTooLarge(limit));
        }
        read.extend_from_slice(&chunk);
    }
    Ok(read.freeze())
}

fn headers_of(headers: &actix_web::http::header::HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            out.append(name, value);
        }
    }
    out
}

fn to_http(response: HttpResponse<BoxBody>) -> http::Response<Body> {
    let mut out = http::Response::new(Body(BoxBody::new(())));
    *out.status_mut() = StatusCode::from_u16(response.status().as_u16()).unwrap_or_default();
    *out.headers_mut() = headers_of(response.headers());
    *out.body_mut() = Body(response.into_body());
    out
}

fn from_http(response: http::Response<BoxBody>) -> HttpResponse<BoxBody> {
    let (parts, body) = response.into_parts();
    let status = actix_web::http::StatusCode::from_u16(parts.status.as_u16())
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = HttpResponse::with_body(status, body);
    for (name, value) in &parts.headers {
        if let (Ok(name), Ok(value)) = (
            actix_web::http::header::HeaderName::from_bytes(name.as_str().as_bytes()),
            actix_web::http::header::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            out.headers_mut().append(name, value);
        }
    }
    out
}

fn reply(request: &HttpRequest, response: http::Response<Bytes>) -> ServiceResponse<BoxBody> {
    ServiceResponse::new(request.clone(), from_http(response.map(BoxBody::new)))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use super::*;

    #[actix_web::test]
    async fn a_dropped_exchange_finishes_in_a_local_task() {
        // An `Rc` keeps the exchange from being `Send`, as actix's are.
        let finished = Rc::new(Cell::new(false));
        let (gate, wait) = tokio::sync::oneshot::channel::<()>();
        let (done, ended) = tokio::sync::oneshot::channel::<()>();
        let flag = Rc::clone(&finished);
        let rest = async move {
            let _ = wait.await;
            flag.set(true);
            let _ = done.send(());
        };
        let mut exchange = Uncancelled::new(rest, finish_locally);
        assert!(poll_once(&mut exchange).is_pending());
        drop(exchange);
        gate.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .expect("the dropped exchange finished in a local task")
            .unwrap();
        assert!(finished.get());
    }

    #[test]
    fn an_exchange_dropped_outside_the_runtime_is_not_a_panic() {
        let mut exchange = Uncancelled::new(std::future::pending::<()>(), finish_locally);
        assert!(poll_once(&mut exchange).is_pending());
        drop(exchange);
    }

    fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        Pin::new(future).poll(&mut Context::from_waker(std::task::Waker::noop()))
    }
}
