//! `IdempotencyService`: moves each protected call between tower and the
//! exchange (claim, run once, record or release; replay; statuses).

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::Full;
use idem_core::store::StoreError;
use idem_core::{Begin, Error, Idempotent, Key, Lease, When};
use idem_http::{Panicked, Uncancelled};
use tonic::Code;
use tower_service::Service;

use crate::body::{collect, BoxError, Collected, ReplyBody};
use crate::layer::{Config, KeySource};
use crate::protocol::{
    self, answer, in_progress, invalid_key, missing_key, refuse, Framing, REPLAYED,
};
use crate::stored::{self, Call, Stored, Unreplayable};

/// The future an [`IdempotencyService`] returns. It is `Send`.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ReplyBody<B>>, E>> + Send + 'static>>;

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps around
/// a tonic server (or anything that serves gRPC over `http` types); see
/// the layer for what it does.
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
    S: Service<Request<tonic::body::Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ReplyBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The instance that was polled ready is the one to call; the clone
        // stays behind for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(source) = self.config.methods.get(request.uri().path()).cloned() else {
            let future = inner.call(request.map(tonic::body::Body::new));
            return Box::pin(async move { Ok(future.await?.map(ReplyBody::inner)) });
        };
        Box::pin(handle(inner, Arc::clone(&self.config), source, request))
    }
}

async fn handle<S, B, ResBody>(
    inner: S,
    config: Arc<Config>,
    source: KeySource,
    request: Request<B>,
) -> Result<Response<ReplyBody<ResBody>>, S::Error>
where
    S: Service<Request<tonic::body::Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // A key in metadata is checked before the message is read.
    let metadata_key = match source {
        KeySource::Metadata => match request.headers().get(&config.key) {
            Some(value) => match value.to_str() {
                Ok(key) => Some(key.to_owned()),
                Err(_) => return Ok(invalid_key("not visible ASCII")),
            },
            None if config.require_key => return Ok(missing_key(&config.key)),
            None => return pass(inner, request.map(tonic::body::Body::new)).await,
        },
        KeySource::Message(_) => None,
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::error!("idem-tonic needs a tokio runtime; refusing a protected call");
        return Ok(answer(
            Code::Internal,
            "the idempotency layer has no async runtime",
        ));
    };
    let (parts, body) = request.into_parts();
    let body = match idem_http::read_body(body, config.max_request).await {
        Ok(body) => body,
        Err(idem_http::ReadBodyError::TooLarge) => {
            let message = format!(
                "the request message is over the idempotency layer's limit of {} bytes",
                config.max_request
            );
            return Ok(answer(Code::ResourceExhausted, &message));
        }
        Err(error) => {
            tracing::debug!(%error, "request message could not be read");
            return Ok(answer(
                Code::Cancelled,
                "the request message could not be read",
            ));
        }
    };
    let message = match protocol::single_message(&body) {
        Ok(message) => message,
        Err(Framing::Truncated) => {
            return Ok(answer(Code::Internal, "the request message is truncated"))
        }
        Err(Framing::Several) => {
            return Ok(answer(
                Code::InvalidArgument,
                "a protected method takes exactly one request message",
            ))
        }
    };
    let key = match (metadata_key, &source) {
        (Some(key), _) => key,
        (None, KeySource::Message(read)) => {
            if message.compressed {
                return Ok(answer(
                    Code::InvalidArgument,
                    "the idempotency key cannot be read from a compressed message",
                ));
            }
            match read(&message.bytes) {
                Ok(Some(key)) if !key.is_empty() => key,
                Ok(_) if config.require_key => return Ok(missing_key(&config.key)),
                Ok(_) => {
                    let request = Request::from_parts(parts, full(body));
                    return pass(inner, request).await;
                }
                Err(error) => {
                    tracing::debug!(%error, "request message does not decode");
                    return Ok(answer(
                        Code::InvalidArgument,
                        "the request message does not decode",
                    ));
                }
            }
        }
        (None, KeySource::Metadata) => unreachable!("a metadata key was read above"),
    };
    if let Err(error) = Key::validate_client_key(&key) {
        return Ok(invalid_key(&error.to_string()));
    }
    // The application's scope, else the handle's own, else the caller's
    // (the `authorization` metadata, hashed), as idem-http decides it.
    let named = config.scope.as_ref().and_then(|extract| extract(&parts));
    let (idem, unscoped) = match named.filter(|scope| !scope.is_empty()) {
        Some(scope) => (config.idem.scoped(scope), None),
        None if config.shared || !config.idem.scope().is_empty() => (config.idem.clone(), None),
        None => {
            let caller = idem_http::Caller::of(&parts.headers);
            let unscoped = config.check_unscoped.then(|| config.idem.clone());
            (config.idem.scoped(caller.scope()), unscoped)
        }
    };
    let fingerprint = protocol::fingerprint(
        parts.uri.path(),
        &parts.headers,
        message.compressed,
        &message.bytes,
    );
    let wait = idem_http::preferred_wait(&parts.headers)
        .map(|wait| wait.min(config.max_wait))
        .filter(|wait| !wait.is_zero());
    let request = Request::from_parts(parts, full(body));
    // From the claim on, nothing may be cancelled: a client that hangs up
    // (or a cut connection) must neither leave a claimed key that nobody
    // will run or release, nor cancel the handler or its recording. The
    // exchange runs in this future, and goes on in a task of its own on
    // the call's runtime if this future is dropped first.
    let exchange = Uncancelled::new(
        async move {
            let exchange = Exchange {
                config: &config,
                idem: &idem,
                unscoped: unscoped.as_ref(),
                key: &key,
            };
            exchange.run(fingerprint, wait, inner, request).await
        },
        move |rest| drop(runtime.spawn(rest)),
    );
    match exchange.await {
        Ok(result) => result,
        Err(Panicked) => {
            // The side effect may have happened, so the key is left claimed
            // until its lease lapses rather than released.
            tracing::error!("the handler panicked; the key stays claimed until its lease lapses");
            Ok(answer(Code::Internal, "the handler failed"))
        }
    }
}

fn full(body: Bytes) -> tonic::body::Body {
    tonic::body::Body::new(Full::new(body))
}

async fn pass<S, ResBody>(
    mut inner: S,
    request: Request<tonic::body::Body>,
) -> Result<Response<ReplyBody<ResBody>>, S::Error>
where
    S: Service<Request<tonic::body::Body>, Response = Response<ResBody>>,
{
    Ok(inner.call(request).await?.map(ReplyBody::inner))
}

/// One protected call's claim, run and recording.
struct Exchange<'a> {
    config: &'a Config,
    idem: &'a Idempotent,
    /// The handle with no scope, when the call is checked in its caller's
    /// scope and records made before callers were told apart are looked
    /// for.
    unscoped: Option<&'a Idempotent>,
    key: &'a str,
}

impl Exchange<'_> {
    async fn run<S, ResBody>(
        &self,
        fingerprint: idem_core::Fingerprint,
        wait: Option<Duration>,
        mut inner: S,
        request: Request<tonic::body::Body>,
    ) -> Result<Response<ReplyBody<ResBody>>, S::Error>
    where
        S: Service<Request<tonic::body::Body>, Response = Response<ResBody>>,
        ResBody: Body<Data = Bytes>,
        ResBody::Error: Into<BoxError>,
    {
        let mut begun = self
            .timed(
                self.config.store_timeout,
                self.idem.begin(self.key, fingerprint),
            )
            .await;
        let mut waited = false;
        if let (Err(Error::InProgress { .. }), Some(wait)) = (&begun, wait) {
            let waiting = self.idem.clone().with_wait(wait);
            let bound = wait.saturating_add(self.config.store_timeout);
            begun = self
                .timed(bound, waiting.begin(self.key, fingerprint))
                .await;
            waited = true;
        }
        let mut response = match begun {
            Ok(Begin::Run(lease)) => match self.unscoped_answer(fingerprint).await {
                Some(refused) => {
                    self.release(&lease).await;
                    refused
                }
                None => self.execute(lease, inner, request).await?,
            },
            Ok(Begin::Replay(replay)) => self.replay(replay.into_payload()),
            Err(Error::Store { source, .. }) if self.config.fail_open => {
                tracing::warn!(key = self.key, error = %source,
                    "idempotency store failed; running the call unprotected (fail open)");
                inner.call(request).await?.map(ReplyBody::inner)
            }
            Err(error) => refuse(self.key, error),
            Ok(_) => answer(Code::Internal, "unknown outcome from the idempotency store"),
        };
        if waited {
            response.headers_mut().append(
                idem_http::PREFERENCE_APPLIED,
                HeaderValue::from_static("wait"),
            );
        }
        Ok(response)
    }

    /// For a call about to run in its caller's scope: the answer when its
    /// key has a record in no scope that this call may retry (see
    /// [`idem_http::unscoped_record`]), or `None` to run it.
    async fn unscoped_answer<B: Default>(
        &self,
        fingerprint: idem_core::Fingerprint,
    ) -> Option<Response<B>> {
        let unscoped = self.unscoped?;
        let fingerprints = idem_core::fingerprint::MatchingFingerprints::new(fingerprint);
        let found = async {
            idem_http::unscoped_record(unscoped, self.key, &fingerprints)
                .await
                .map_err(|source| Error::Store {
                    source,
                    when: When::BeforeWork,
                })
        };
        match self.timed(self.config.store_timeout, found).await {
            Ok(None) => None,
            Ok(Some(idem_http::UnscopedRecord::InFlight(left))) => Some(in_progress(left)),
            Ok(Some(_)) => Some(answer(
                Code::AlreadyExists,
                "the call with this idempotency key ran before keys were scoped by caller; \
                 its answer is not replayed, since its caller is unknown",
            )),
            Err(error) if self.config.fail_open => {
                tracing::warn!(key = self.key, %error,
                    "idempotency store failed looking for an unscoped record; running the call (fail open)");
                None
            }
            Err(error) => Some(refuse(self.key, error)),
        }
    }

    fn replay<B>(&self, payload: Vec<u8>) -> Response<ReplyBody<B>> {
        match stored::decode(payload) {
            Ok(Stored::Call(call)) => replayed(*call),
            Ok(Stored::Unreplayable(why)) => answer(
                Code::AlreadyExists,
                &format!(
                    "the call with this idempotency key ran, but its answer was not kept: {}",
                    why.reason()
                ),
            ),
            Err(error) => {
                tracing::error!(key = self.key, %error, "recorded answer does not decode");
                answer(
                    Code::Internal,
                    "the recorded answer for this idempotency key is damaged",
                )
            }
        }
    }

    /// Runs the handler under `lease`, then records or releases.
    async fn execute<S, ResBody>(
        &self,
        lease: Lease,
        mut inner: S,
        request: Request<tonic::body::Body>,
    ) -> Result<Response<ReplyBody<ResBody>>, S::Error>
    where
        S: Service<Request<tonic::body::Body>, Response = Response<ResBody>>,
        ResBody: Body<Data = Bytes>,
        ResBody::Error: Into<BoxError>,
    {
        let limit = self.config.max_response;
        let work = async {
            let (parts, body) = inner.call(request).await?.into_parts();
            Ok((parts, collect(Box::pin(body), limit).await))
        };
        let ran = lease.run(work).await;
        let (parts, collected) = match ran.output {
            Err(error) => {
                self.release(&lease).await;
                return Err(error);
            }
            Ok(done) => done,
        };
        match collected {
            Collected::Whole { data, trailers } => {
                let code = protocol::status_of(&parts.headers, trailers.as_ref());
                let released = parts.status != http::StatusCode::OK
                    || (code != Code::Ok && self.config.released.contains(&code));
                if released {
                    self.release(&lease).await;
                } else {
                    let empty = http::HeaderMap::new();
                    let payload = stored::encode(
                        parts.status,
                        &parts.headers,
                        &data,
                        trailers.as_ref().unwrap_or(&empty),
                    );
                    self.record(&lease, &payload).await;
                }
                Ok(Response::from_parts(
                    parts,
                    ReplyBody::whole(data, trailers),
                ))
            }
            Collected::TooLarge { prefix, rest } => {
                tracing::warn!(key = %lease.key(), limit,
                    "answer too large to record; retries will get ALREADY_EXISTS");
                self.record(&lease, &stored::encode_unreplayable(Unreplayable::TooLarge))
                    .await;
                Ok(Response::from_parts(
                    parts,
                    ReplyBody::prefixed(prefix, rest),
                ))
            }
            Collected::Failed(error) => {
                tracing::error!(key = %lease.key(), %error,
                    "the answer failed after the handler ran; marking the key as run");
                self.record(
                    &lease,
                    &stored::encode_unreplayable(Unreplayable::BodyFailed),
                )
                .await;
                Ok(answer(
                    Code::Internal,
                    "the answer failed while it was read",
                ))
            }
        }
    }

    /// One store call, bounded.
    async fn timed<T>(
        &self,
        bound: Duration,
        call: impl IntoFuture<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(bound, call).await {
            Ok(done) => done,
            Err(_) => Err(Error::Store {
                source: StoreError::backend(
                    "idem-tonic",
                    format!("the store did not answer within {bound:?}"),
                ),
                when: When::BeforeWork,
            }),
        }
    }

    async fn record(&self, lease: &Lease, payload: &[u8]) {
        let bound = self.config.store_timeout;
        for attempt in 1..=RECORD_ATTEMPTS {
            match self.timed(bound, lease.complete(payload)).await {
                Ok(()) => return,
                Err(Error::Store { source, .. }) if attempt < RECORD_ATTEMPTS => {
                    tracing::warn!(key = %lease.key(), attempt, error = %source,
                        "recording the answer failed; trying again");
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                }
                Err(Error::LeaseLost) if attempt > 1 => {
                    // An earlier attempt that reported an error may have landed.
                    tracing::warn!(key = %lease.key(),
                        "recording after a store error found the lease gone; the answer may be recorded");
                    return;
                }
                Err(error) => {
                    tracing::error!(key = %lease.key(), %error, "the answer could not be recorded");
                    return;
                }
            }
        }
    }

    async fn release(&self, lease: &Lease) {
        if let Err(error) = self.timed(self.config.store_timeout, lease.release()).await {
            tracing::warn!(key = %lease.key(), %error,
                "could not release the key; it stays claimed until its lease lapses");
        }
    }
}

// A store that blips at the moment of recording would otherwise leave the
// key claimed until its lease lapses and then let a retry run the handler
// a second time, so recording is tried a few times while the lease holds.
const RECORD_ATTEMPTS: u32 = 3;

/// The answer a replay sends: the recorded headers, message and trailers,
/// and `idempotent-replayed: true` in the headers.
fn replayed<B>(call: Call) -> Response<ReplyBody<B>> {
    let trailers = (!call.trailers.is_empty()).then_some(call.trailers);
    let mut response = Response::new(ReplyBody::whole(call.body, trailers));
    *response.status_mut() = call.status;
    *response.headers_mut() = call.headers;
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    response
}
