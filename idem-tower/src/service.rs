//! `IdempotencyService`: moves each request between tower and idem-http's
//! exchange.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use idem_http::{read_body, Admission, Panicked, Problem, ReadBodyError, Reply, Uncancelled};
use tower_service::Service;

use crate::body::{BoxError, RequestBody, ResponseBody};
use crate::layer::Config;

/// The future an [`IdempotencyService`] returns. It is `Send`.
pub type ResponseFuture<E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, E>> + Send + 'static>>;

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps around
/// a handler; see the layer for what it does.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        IdempotencyService { inner, config }
    }
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, B, ResBody> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The instance that was polled ready is the one to call; the clone
        // stays behind for the next poll_ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        // Decided here, from the headers alone, so that a request passed
        // through gets a future of its own and a protected one a future
        // without the handler's (which its exchange boxes when it runs).
        let key = match self
            .config
            .options
            .admit(request.method(), request.headers())
        {
            Admission::Protect(key) => Some(key),
            Admission::KeyInBody => None,
            Admission::Refuse(problem) => {
                return Box::pin(std::future::ready(Ok(problem_response(problem))))
            }
            _ => return Box::pin(pass(inner, request.map(RequestBody::new))),
        };
        Box::pin(handle(inner, Arc::clone(&self.config), request, key))
    }
}

async fn handle<S, B, ResBody>(
    mut inner: S,
    config: Arc<Config>,
    request: Request<B>,
    key: Option<String>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<RequestBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let options = &config.options;
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::error!("idem-tower needs a tokio runtime; refusing a protected request");
        return Ok(problem_response(Problem::Internal(
            "the idempotency layer has no async runtime",
        )));
    };
    let (parts, body) = request.into_parts();
    let limit = options.max_request_body();
    let body = match read_body(body, limit).await {
        Ok(body) => body,
        Err(ReadBodyError::TooLarge) => return Ok(problem_response(Problem::BodyTooLarge(limit))),
        Err(error) => {
            tracing::debug!(%error, "request body could not be read");
            return Ok(problem_response(Problem::UnreadableBody));
        }
    };
    let key = match key {
        Some(key) => key,
        None => match options.admit_body(&parts.method, &parts.uri, &parts.headers, &body) {
            Admission::Protect(key) => key,
            Admission::Refuse(problem) => return Ok(problem_response(problem)),
            _ => {
                let request = Request::from_parts(parts, RequestBody::full(body));
                return Box::pin(pass(inner, request)).await;
            }
        },
    };
    // A scoped handle of its own only where the application names a scope;
    // otherwise the options' handle serves as it is, and the exchange
    // scopes it by the request's caller.
    // Boxed: the exchange's future, which holds it, is moved into a box of
    // its own, and a handle is large beside a pointer.
    let scoped = config
        .scope
        .as_ref()
        .and_then(|extract| extract(&parts))
        .map(|scope| Box::new(options.idempotent().scoped(scope)));
    let fingerprint = options.fingerprint(&parts.method, &parts.uri, &parts.headers, &body);
    let context = options.request_context(&parts.headers);
    // From the claim on, nothing may be cancelled: a client that hangs up
    // while the claim is in flight must not leave a claimed key that nobody
    // will run or release, and one that hangs up mid-handler must not
    // cancel the handler or its recording. The exchange runs in this
    // future, and goes on in a task of its own on the request's runtime if
    // this future is dropped before it is done.
    let exchange = Uncancelled::new(
        async move {
            let idem = scoped.as_deref().unwrap_or(config.options.idempotent());
            let reply = config
                .options
                .exchange_with(idem, &key, fingerprint, context, || async {
                    // Built only when the handler runs: a replay drops the
                    // parts and the bytes without boxing a body.
                    let request = Request::from_parts(parts, RequestBody::full(body));
                    let response = inner.call(request).await?;
                    Ok(response.map(ResponseBody::new))
                });
            reply.await.map(|reply| match reply {
                Reply::Whole(response) => response.map(ResponseBody::full),
                Reply::Handler(response) => response,
                Reply::Streamed(response, recording) => {
                    if let Some(recording) = recording {
                        // It outlives the request: a client that hangs up
                        // does not stop the recording.
                        drop(tokio::spawn(recording.run()));
                    }
                    response.map(ResponseBody::frames)
                }
                _ => problem_response(Problem::Internal("unknown reply")),
            })
        },
        move |rest| drop(runtime.spawn(rest)),
    );
    match exchange.await {
        Ok(result) => result,
        Err(Panicked) => {
            // The side effect may have happened, so the key is left claimed
            // until its lease lapses rather than released.
            tracing::error!("the handler panicked; the key stays claimed until its lease lapses");
            Ok(problem_response(Problem::Internal("the handler failed")))
        }
    }
}

fn problem_response(problem: Problem) -> Response<ResponseBody> {
    problem.into_response().map(ResponseBody::full)
}

async fn pass<S, ResBody>(
    mut inner: S,
    request: Request<RequestBody>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<RequestBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let response = inner.call(request).await?;
    Ok(response.map(ResponseBody::new))
}
