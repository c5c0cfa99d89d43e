//! `IdempotencyService`: maps each request onto idem-core's begin/complete
//! API.

use std::fmt;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use idem_core::{Begin, Error, Fingerprint, Idempotent, KeyError, Lease, StoreError, When};
use tower_service::Service;

use crate::body::{BoxError, RequestBody, ResponseBody};
use crate::layer::Config;
use crate::problem::Problem;
use crate::request::{client_key, collect_body, fingerprint, BodyError};
use crate::response::{self, Collected, Stored, Unreplayable};

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
        Box::pin(handle(inner, Arc::clone(&self.config), request))
    }
}

async fn handle<S, B, ResBody>(
    inner: S,
    config: Arc<Config>,
    request: Request<B>,
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
    if !config.methods.contains(request.method()) {
        return pass(inner, request.map(RequestBody::new)).await;
    }
    let key = match client_key(request.headers(), &config.header) {
        Ok(Some(key)) => key,
        Ok(None) if config.require_key => {
            return Ok(Problem::MissingKey(config.header.to_string()).into_response())
        }
        Ok(None) => return pass(inner, request.map(RequestBody::new)).await,
        Err(error) => return Ok(Problem::InvalidKey(error.detail(&config.header)).into_response()),
    };
    if tokio::runtime::Handle::try_current().is_err() {
        tracing::error!("idem-tower needs a tokio runtime; refusing a protected request");
        return Ok(Problem::Internal("the idempotency layer has no async runtime").into_response());
    }
    let (parts, body) = request.into_parts();
    let body = match collect_body(&parts.headers, body, config.max_request_body).await {
        Ok(body) => body,
        Err(BodyError::TooLarge) => {
            return Ok(Problem::BodyTooLarge(config.max_request_body).into_response())
        }
        Err(BodyError::Unreadable(error)) => {
            tracing::debug!(%error, "request body could not be read");
            return Ok(Problem::UnreadableBody.into_response());
        }
    };
    let idem = match &config.scope {
        Some(extract) => config.idem.scoped(extract(&parts).unwrap_or_default()),
        None => config.idem.clone(),
    };
    let fingerprint = fingerprint(&parts, &body);
    let request = Request::from_parts(parts, RequestBody::full(body));
    // From the claim on, everything runs in a task of its own: a client that
    // hangs up while the claim is in flight must not leave a claimed key
    // that nobody will run or release, and one that hangs up mid-handler
    // must not cancel the handler or its recording.
    let key_for_log = key.clone();
    match tokio::spawn(claim_and_run(
        inner,
        config,
        idem,
        key,
        fingerprint,
        request,
    ))
    .await
    {
        Ok(result) => result,
        Err(join) => {
            // The side effect may have happened, so the key is left claimed
            // until its lease lapses rather than released.
            tracing::error!(key = key_for_log, error = %join, "handler task failed; the key stays claimed until its lease lapses");
            Ok(Problem::Internal("the handler failed").into_response())
        }
    }
}

/// Claims the key, then runs and records the handler, or answers with the
/// replay or the problem.
async fn claim_and_run<S, ResBody>(
    inner: S,
    config: Arc<Config>,
    idem: Idempotent,
    key: String,
    fingerprint: Fingerprint,
    request: Request<RequestBody>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<RequestBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let begun =
        match tokio::time::timeout(config.store_timeout, idem.begin(&key, fingerprint)).await {
            Ok(begun) => begun,
            Err(_) => Err(Error::Store {
                source: timed_out(config.store_timeout),
                when: When::BeforeWork,
            }),
        };
    let problem = match begun {
        Ok(Begin::Run(lease)) => return execute(inner, config, lease, request).await,
        Ok(Begin::Replay(replay)) => match response::decode(replay.payload()) {
            Ok(Stored::Response {
                status,
                headers,
                body,
            }) => return Ok(response::replay(status, headers, body)),
            Ok(Stored::Unreplayable(why)) => Problem::NotReplayable(why.reason()),
            Err(error) => {
                tracing::error!(key, %error, "recorded response does not decode");
                Problem::Internal("the recorded response for this idempotency key is damaged")
            }
        },
        Ok(_) => Problem::Internal("unknown outcome from the idempotency store"),
        Err(Error::InvalidKey(KeyError::InvalidScope {
            part: "namespace", ..
        })) => {
            tracing::error!(key, "the idempotency namespace is not usable");
            Problem::Internal("the idempotency layer is misconfigured")
        }
        Err(Error::InvalidKey(error)) => Problem::InvalidKey(error.to_string()),
        Err(Error::Mismatch) => Problem::Mismatch,
        Err(Error::InProgress { retry_after }) => Problem::InProgress(retry_after),
        Err(Error::Store { source, .. }) if config.fail_open => {
            tracing::warn!(key, error = %source, "idempotency store failed; running the request unprotected (fail open)");
            return pass(inner, request).await;
        }
        Err(Error::Store { source, .. }) => {
            tracing::error!(key, error = %source, "idempotency store failed; answering 503");
            Problem::StoreUnavailable
        }
        Err(error) => {
            tracing::error!(key, %error, "idempotency check failed");
            Problem::Internal("the idempotency check failed")
        }
    };
    Ok(problem.into_response())
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

enum Outcome {
    /// A response not to record: the key is released.
    Release(Response<ResponseBody>),
    /// A response to record, with its body read up to the limit.
    Record(http::response::Parts, Collected),
}

async fn execute<S, ResBody>(
    mut inner: S,
    config: Arc<Config>,
    lease: Lease,
    request: Request<RequestBody>,
) -> Result<Response<ResponseBody>, S::Error>
where
    S: Service<Request<RequestBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let limit = config.max_response_body;
    let work = async {
        let (parts, body) = inner.call(request).await?.into_parts();
        let body = ResponseBody::new(body);
        let recorded = match parts.status.as_u16() {
            200..=499 => true,
            500.. => config.record_server_errors,
            _ => false,
        };
        if !recorded {
            return Ok(Outcome::Release(Response::from_parts(parts, body)));
        }
        let collected = response::collect(body, limit).await;
        Ok(Outcome::Record(parts, collected))
    };
    let outcome = with_heartbeat(&lease, work).await;
    let timeout = config.store_timeout;
    let (parts, collected) = match outcome {
        Err(error) => {
            release(&lease, timeout).await;
            return Err(error);
        }
        Ok(Outcome::Release(response)) => {
            release(&lease, timeout).await;
            return Ok(response);
        }
        Ok(Outcome::Record(parts, collected)) => (parts, collected),
    };
    match collected {
        Collected::Whole(body) => {
            record(
                &lease,
                timeout,
                &response::encode(parts.status, &parts.headers, &body),
            )
            .await;
            Ok(Response::from_parts(parts, ResponseBody::full(body)))
        }
        Collected::TooLarge(body) => {
            tracing::warn!(key = %lease.key(), limit,
                "response too large to record; retries will get a not-replayable 409");
            record(
                &lease,
                timeout,
                &response::encode_unreplayable(Unreplayable::TooLarge),
            )
            .await;
            Ok(Response::from_parts(parts, body))
        }
        Collected::Failed(error) => {
            tracing::error!(key = %lease.key(), %error,
                "response body failed after the handler ran; marking the key as executed");
            record(
                &lease,
                timeout,
                &response::encode_unreplayable(Unreplayable::BodyFailed),
            )
            .await;
            Ok(Problem::Internal("the response body failed").into_response())
        }
    }
}

/// Polls `work` and the lease's heartbeat together; the heartbeat ends only
/// when the lease is lost, and then the work is finished on its own.
async fn with_heartbeat<F: Future>(lease: &Lease, work: F) -> F::Output {
    let mut work = pin!(work);
    tokio::select! {
        biased;
        output = &mut work => output,
        () = lease.heartbeat() => {
            tracing::warn!(key = %lease.key(), "lease lost while the handler ran; its response will not be recorded");
            work.await
        }
    }
}

// A store that blips at the moment of recording would otherwise leave the
// key claimed until its lease lapses and then let a retry run the handler a
// second time, so recording is tried a few times while the lease still holds.
const RECORD_ATTEMPTS: u32 = 3;

async fn record(lease: &Lease, timeout: Duration, payload: &[u8]) {
    for attempt in 1..=RECORD_ATTEMPTS {
        let completed = match tokio::time::timeout(timeout, lease.complete(payload)).await {
            Ok(completed) => completed,
            Err(_) => Err(Error::Store {
                source: timed_out(timeout),
                when: When::AfterWork,
            }),
        };
        match completed {
            Ok(()) => return,
            Err(Error::Store { source, .. }) if attempt < RECORD_ATTEMPTS => {
                tracing::warn!(key = %lease.key(), attempt, error = %source, "recording the response failed; trying again");
                tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
            }
            Err(Error::LeaseLost) if attempt > 1 => {
                // An earlier attempt that reported an error may have landed.
                tracing::warn!(key = %lease.key(), "recording after a store error found the lease gone; the response may be recorded");
                return;
            }
            Err(error) => {
                tracing::error!(key = %lease.key(), %error, "the response could not be recorded");
                return;
            }
        }
    }
}

async fn release(lease: &Lease, timeout: Duration) {
    let released = match tokio::time::timeout(timeout, lease.release()).await {
        Ok(Ok(())) => return,
        Ok(Err(error)) => error.to_string(),
        Err(_) => timed_out(timeout).to_string(),
    };
    tracing::warn!(key = %lease.key(), error = released,
        "could not release the key; it stays claimed until its lease lapses");
}

fn timed_out(after: Duration) -> StoreError {
    StoreError::backend(
        "idem-tower",
        format!("the store did not answer within {after:?}"),
    )
}
