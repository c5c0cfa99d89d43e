//! The exchange: admit a request, claim its key, run the handler, then
//! record or release; or answer with the replay or a problem.

use std::future::{Future, IntoFuture};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Method, Response};
use idem_core::fingerprint::MatchingFingerprints;
use idem_core::store::StoreError;
use idem_core::{Begin, Error, Idempotent, KeyError, Lease, When};
use tracing::Instrument;

use crate::stored::{self, Stored, Unreplayable};
use crate::stream::{Frames, Recording};
use crate::{client_key, Caller, Options, Problem, TraceParent};

/// The error a response body fails with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What to do with a request, decided from its method and headers alone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// Not protected: hand it to the handler untouched.
    Pass,
    /// Refused before its body is read: send the problem.
    Refuse(Problem),
    /// Protected under this client key: read the body within
    /// [`Options::max_request_body`], then call [`Options::exchange`].
    Protect(String),
    /// Protected, with the key in the body or found by a function over the
    /// whole request ([`Options::with_key_source`]): read the body within
    /// [`Options::max_request_body`], then ask [`Options::admit_body`]. An
    /// adapter that passes this through unprotected loses the protection.
    KeyInBody,
}

/// A response body an adapter can read up to a limit, and frame by frame.
pub trait ResponseBody: Sized {
    /// Whether [`frame`](ResponseBody::frame) reads this body, so that a
    /// body over the whole-record limit can be recorded in chunks while it
    /// streams. `false` (the default) keeps such a body unrecorded, as
    /// before chunked records existed.
    const STREAMS: bool = false;

    /// Reads the whole body unless it holds more than `limit` bytes. Over
    /// the limit, the body handed back must still send every byte, those
    /// already read first. Trailers are not kept, so a first response and
    /// its replays send the same frames.
    fn collect(self, limit: usize) -> impl Future<Output = Collected<Self>>;

    /// The body's next data frame, or `None` at its end; trailers are
    /// skipped. It MUST lose nothing when dropped before it is ready (a
    /// body polled frame by frame is), since the recording polls it once
    /// to learn whether a frame is ready. Only called when
    /// [`STREAMS`](ResponseBody::STREAMS) is `true`; the default says the
    /// body cannot be read this way.
    fn frame(&mut self) -> impl Future<Output = Option<Result<Bytes, BoxError>>> {
        std::future::ready(Some(Err("this body is not read frame by frame".into())))
    }

    /// The body's length in bytes when it is known before it is read (a
    /// body of bytes in memory), all of it, including any part `collect`
    /// already read; `None` (the default) when it is not.
    fn exact_len(&self) -> Option<u64> {
        None
    }
}

/// A handler's response body, read up to a limit.
#[derive(Debug)]
#[non_exhaustive]
pub enum Collected<B> {
    /// The whole body.
    Whole(Bytes),
    /// Over the limit: the body to stream, from its first byte.
    TooLarge(B),
    /// The body failed while it was read.
    Failed(BoxError),
}

/// What an exchange reads from a request besides its key and fingerprint:
/// the wait it asks for, the trace it was sent from and who sent it. An
/// adapter gets it from the request's headers with
/// [`Options::request_context`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestContext {
    /// How long a request that finds its key in progress waits for the
    /// outcome (`Prefer: wait=N`, capped by [`Options::with_max_wait`]);
    /// `None` answers 409 at once.
    pub wait: Option<Duration>,
    /// The request's W3C `traceparent`, kept with its recorded response so
    /// that replays link back to it (see the crate docs, "Trace
    /// continuity").
    pub traceparent: Option<TraceParent>,
    /// Who sent the request: a handle with no scope is scoped by this
    /// caller ([`Caller::scope`]); `None` leaves it as it is (keys shared
    /// across callers).
    pub caller: Option<Caller>,
}

impl RequestContext {
    /// No wait, no trace parent, no caller.
    pub fn new() -> RequestContext {
        RequestContext::default()
    }

    /// Sets the wait.
    pub fn with_wait(mut self, wait: Option<Duration>) -> RequestContext {
        self.wait = wait;
        self
    }

    /// Sets the trace parent.
    pub fn with_traceparent(mut self, traceparent: Option<TraceParent>) -> RequestContext {
        self.traceparent = traceparent;
        self
    }

    /// Sets the caller.
    pub fn with_caller(mut self, caller: Option<Caller>) -> RequestContext {
        self.caller = caller;
        self
    }
}

/// What an adapter sends back.
#[derive(Debug)]
#[non_exhaustive]
pub enum Reply<B> {
    /// A response made whole: a replay, a problem, or the handler's
    /// response whose body was read to record it.
    Whole(Response<Bytes>),
    /// The handler's response with its own body: released, too large to
    /// record, or run unprotected.
    Handler(Response<B>),
    /// A response whose body streams: the replay of a response recorded in
    /// chunks (no [`Recording`]), or the handler's response over
    /// [`Options::max_response_body`], which reaches the client through
    /// these frames while the [`Recording`] writes it to the store. The
    /// adapter sends the response and drives the recording to its end in
    /// a task of its own: it must outlive the request.
    Streamed(Response<Frames>, Option<Recording<B>>),
}

impl Options {
    /// Decides from the method and headers whether the request is
    /// protected, passed through, or refused (a bad key, a missing key when
    /// keys are required, a `Content-Length` over the request limit).
    pub fn admit(&self, method: &Method, headers: &HeaderMap) -> Admission {
        if !self.methods.contains(method) {
            return Admission::Pass;
        }
        if self.body_key.is_some() {
            return self.admit_before_body(headers);
        }
        let key = match client_key(headers, &self.header) {
            Ok(Some(key)) => key,
            Ok(None) if self.require_key => {
                return Admission::Refuse(Problem::MissingKey(self.header.to_string()))
            }
            Ok(None) => return Admission::Pass,
            Err(error) => {
                return Admission::Refuse(Problem::InvalidKey(error.detail(&self.header)))
            }
        };
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.max_request_body as u64) {
            return Admission::Refuse(Problem::BodyTooLarge(self.max_request_body));
        }
        Admission::Protect(key)
    }

    /// Claims `key` for the request `fingerprint` names in `idem` (the
    /// options' [`Idempotent`], scoped as the adapter decides), then runs
    /// `handler` once with the lease renewed, and records its response or
    /// releases the key; or answers with the recorded response or a problem.
    ///
    /// It sees no headers, so it knows no caller: the key is checked in
    /// `idem`'s scope as given. An adapter calls
    /// [`exchange_with`](Options::exchange_with) with the request's
    /// [`request_context`](Options::request_context), which scopes a key
    /// by its caller.
    ///
    /// Run it in a task of its own, or hand what is left of it to one when
    /// the request's future is dropped (what idem-tower does): a client
    /// that disconnects must not cancel the claim, the handler or the
    /// recording. Its future is `Send`
    /// when the handler's future and body are.
    pub async fn exchange<H, Fut, B, E>(
        &self,
        idem: &Idempotent,
        key: &str,
        fingerprint: impl Into<MatchingFingerprints>,
        handler: H,
    ) -> Result<Reply<B>, E>
    where
        H: FnOnce() -> Fut,
        Fut: Future<Output = Result<Response<B>, E>>,
        B: ResponseBody,
    {
        self.exchange_waiting(idem, key, fingerprint, None, handler)
            .await
    }

    /// [`exchange`](Options::exchange) for a request that may wait: one
    /// that finds its key in progress waits up to `wait` (from
    /// [`wait_for`](Options::wait_for), the request's `Prefer: wait=N`)
    /// for the outcome, woken by the store where it can, and its answer
    /// carries `Preference-Applied: wait`. Without a wait, or when the key
    /// is not in progress, it is `exchange`, round trips included: the
    /// wait costs a second claim only for a request that found its key in
    /// progress.
    pub async fn exchange_waiting<H, Fut, B, E>(
        &self,
        idem: &Idempotent,
        key: &str,
        fingerprint: impl Into<MatchingFingerprints>,
        wait: Option<Duration>,
        handler: H,
    ) -> Result<Reply<B>, E>
    where
        H: FnOnce() -> Fut,
        Fut: Future<Output = Result<Response<B>, E>>,
        B: ResponseBody,
    {
        let context = RequestContext::new().with_wait(wait);
        self.exchange_with(idem, key, fingerprint, context, handler)
            .await
    }

    /// [`exchange_waiting`](Options::exchange_waiting) with everything an
    /// adapter reads from the request's headers
    /// ([`request_context`](Options::request_context)): the wait, and the
    /// trace parent that a recorded response keeps and its replays link to.
    ///
    /// A handle with no scope is scoped by the context's caller
    /// ([`Caller::scope`]), so two callers never share a record; a handle
    /// with a scope (the application's tenant or principal) keeps it.
    ///
    /// The exchange runs in a span `idem.http`, the parent of the core's
    /// `idem.begin` and of the handler's spans. On a replay of a response
    /// recorded with a trace parent, that span gets the field
    /// `idem.original_traceparent` (the header's form) and, with the
    /// feature `otel`, an OpenTelemetry link to that span context.
    pub async fn exchange_with<H, Fut, B, E>(
        &self,
        idem: &Idempotent,
        key: &str,
        fingerprint: impl Into<MatchingFingerprints>,
        context: RequestContext,
        handler: H,
    ) -> Result<Reply<B>, E>
    where
        H: FnOnce() -> Fut,
        Fut: Future<Output = Result<Response<B>, E>>,
        B: ResponseBody,
    {
        // Made only where a subscriber may want it, as idem-core's spans
        // are: a disabled span still costs its making and, with `tracing`'s
        // `log` feature on, a look at the `log` crate on every poll.
        let span = match may_trace(tracing::Level::INFO) {
            true => tracing::info_span!(
                "idem.http",
                idem.original_traceparent = tracing::field::Empty
            ),
            false => tracing::Span::none(),
        };
        let span = match span.is_disabled() {
            true => tracing::Span::none(),
            false => span,
        };
        // Boxed: the exchange's future holds it, and a handle is large
        // beside a pointer.
        let (scoped, unscoped) = match context.caller {
            Some(caller) if idem.scope().is_empty() => (
                Some(Box::new(idem.scoped(caller.scope()))),
                self.check_unscoped.then_some(idem),
            ),
            _ => (None, None),
        };
        let idem = scoped.as_deref().unwrap_or(idem);
        let reply = self
            .exchange_key(idem, key, fingerprint, context, unscoped, handler)
            .instrument(span)
            .await;
        crate::metrics::count(&self.response_keys, idem, &reply);
        reply
    }

    /// What the exchange reads from a request's headers: the wait it asks
    /// for ([`wait_for`](Options::wait_for)), its trace parent
    /// ([`TraceParent::from_headers`]; one that does not parse is left
    /// out, never refused) and its caller ([`caller`](Options::caller)).
    pub fn request_context(&self, headers: &HeaderMap) -> RequestContext {
        RequestContext::new()
            .with_wait(self.wait_for(headers))
            .with_traceparent(TraceParent::from_headers(headers))
            .with_caller(self.caller(headers))
    }

    async fn exchange_key<H, Fut, B, E>(
        &self,
        idem: &Idempotent,
        key: &str,
        fingerprint: impl Into<MatchingFingerprints>,
        context: RequestContext,
        unscoped: Option<&Idempotent>,
        handler: H,
    ) -> Result<Reply<B>, E>
    where
        H: FnOnce() -> Fut,
        Fut: Future<Output = Result<Response<B>, E>>,
        B: ResponseBody,
    {
        let wait = context.wait;
        let fingerprints = fingerprint.into();
        // A request checked in its caller's scope looks in no scope too
        // before it runs, for a record its caller cannot be told from.
        let unscoped = unscoped.map(|unscoped| (unscoped, fingerprints.clone()));
        // Only a request that may wait claims twice and needs them again.
        let (first, again) = match wait {
            Some(_) => (fingerprints.clone(), Some(fingerprints)),
            None => (fingerprints, None),
        };
        let begun = self.timed(idem.begin(key, first), When::BeforeWork).await;
        let (begun, waited) = match (begun, wait, again) {
            (Err(Error::InProgress { .. }), Some(wait), Some(fingerprints)) => {
                // Boxed, as `run` is below: a path few requests take keeps
                // its state out of every request's future.
                let waited = Box::pin(async {
                    // A response being recorded as it streams is followed
                    // rather than waited for.
                    if let Some(reply) = self.follow(idem, key).await {
                        return Ok(reply);
                    }
                    let waiting = idem.clone().with_wait(wait);
                    let call = waiting.begin(key, fingerprints);
                    let bound = wait.saturating_add(self.store_timeout);
                    Err(self.timed_for(bound, call, When::BeforeWork).await)
                });
                match waited.await {
                    Ok(reply) => return Ok(reply),
                    Err(begun) => (begun, true),
                }
            }
            (begun, _, _) => (begun, false),
        };
        let traceparent = context.traceparent.or_else(crate::otel::current);
        let reply = self
            .answer(idem, key, begun, traceparent, unscoped, handler)
            .await;
        if !waited {
            return reply;
        }
        reply.map(|reply| match reply {
            Reply::Whole(mut response) => {
                applied(response.headers_mut());
                Reply::Whole(response)
            }
            Reply::Handler(mut response) => {
                applied(response.headers_mut());
                Reply::Handler(response)
            }
            Reply::Streamed(mut response, recording) => {
                applied(response.headers_mut());
                Reply::Streamed(response, recording)
            }
        })
    }

    /// Answers a request from what its claim found.
    async fn answer<H, Fut, B, E>(
        &self,
        idem: &Idempotent,
        key: &str,
        begun: Result<Begin, Error>,
        traceparent: Option<TraceParent>,
        unscoped: Option<(&Idempotent, MatchingFingerprints)>,
        handler: H,
    ) -> Result<Reply<B>, E>
    where
        H: FnOnce() -> Fut,
        Fut: Future<Output = Result<Response<B>, E>>,
        B: ResponseBody,
    {
        let problem = match begun {
            // The run (the handler's future, its recording) is boxed: a
            // replay, the common retry, then neither builds nor moves its
            // state, which is most of the exchange's size.
            Ok(Begin::Run(lease)) => {
                if let Some((unscoped, fingerprints)) = unscoped {
                    let found = self.unscoped_problem(unscoped, key, &fingerprints).await;
                    let problem = match found {
                        Ok(None) => None,
                        Ok(Some(problem)) => Some(problem),
                        Err(error) if self.fail_open => {
                            tracing::warn!(key, %error, "idempotency store failed looking for an unscoped record; running the request (fail open)");
                            None
                        }
                        Err(error) => {
                            tracing::error!(key, %error, "idempotency store failed looking for an unscoped record; answering 503");
                            Some(Problem::StoreUnavailable)
                        }
                    };
                    if let Some(problem) = problem {
                        self.release(&lease).await;
                        return Ok(Reply::Whole(problem.into_response()));
                    }
                }
                return Box::pin(self.run(lease, traceparent, handler)).await;
            }
            Ok(Begin::Replay(replay)) => match stored::decode_shared(replay.into_payload()) {
                Ok(Stored::Response {
                    status,
                    headers,
                    body,
                    traceparent: original,
                    ..
                }) => {
                    if let Some(original) = original {
                        replayed_from(original);
                    }
                    return Ok(Reply::Whole(stored::replay(status, headers, body)));
                }
                Ok(Stored::Streamed {
                    status,
                    headers,
                    traceparent: original,
                    manifest,
                    ..
                }) => {
                    if let Some(original) = original {
                        replayed_from(original);
                    }
                    match Box::pin(self.replay_chunks(idem, key, manifest)).await {
                        Ok(frames) => {
                            let response = stored::replay(status, headers, frames);
                            return Ok(Reply::Streamed(response, None));
                        }
                        Err(problem) => problem,
                    }
                }
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
            Err(Error::Store { source, .. }) if self.fail_open => {
                tracing::warn!(key, error = %source, "idempotency store failed; running the request unprotected (fail open)");
                return Box::pin(handler()).await.map(Reply::Handler);
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
        Ok(Reply::Whole(problem.into_response()))
    }

    /// Runs the handler under `lease`, then records or releases.
    async fn run<H, Fut, B, E>(
        &self,
        lease: Lease,
        traceparent: Option<TraceParent>,
        handler: H,
    ) -> Result<Reply<B>, E>
    where
        H: FnOnce() -> Fut,
        Fut: Future<Output = Result<Response<B>, E>>,
        B: ResponseBody,
    {
        let limit = self.max_response_body;
        let work = async {
            let (parts, body) = handler().await?.into_parts();
            let recorded = match parts.status.as_u16() {
                200..=499 => true,
                500.. => self.record_server_errors,
                _ => false,
            };
            if !recorded {
                return Ok(Err(Response::from_parts(parts, body)));
            }
            Ok(Ok((parts, body.collect(limit).await)))
        };
        let ran = lease.run(work).await;
        let (parts, collected) = match ran.output {
            Err(error) => {
                self.release(&lease).await;
                return Err(error);
            }
            Ok(Err(response)) => {
                self.release(&lease).await;
                return Ok(Reply::Handler(response));
            }
            Ok(Ok(recorded)) => recorded,
        };
        match collected {
            Collected::Whole(body) => {
                let payload =
                    stored::encode_traced(parts.status, &parts.headers, &body, traceparent);
                self.record(&lease, &payload).await;
                Ok(Reply::Whole(Response::from_parts(parts, body)))
            }
            Collected::TooLarge(body)
                if B::STREAMS && self.streams(&parts.headers, body.exact_len()) =>
            {
                let (frames, recording) = Recording::start(
                    self,
                    &lease,
                    parts.status,
                    parts.headers.clone(),
                    traceparent,
                    body,
                );
                let response = Response::from_parts(parts, frames);
                Ok(Reply::Streamed(response, Some(recording)))
            }
            Collected::TooLarge(body) => {
                tracing::warn!(key = %lease.key(), limit,
                    "response too large to record; retries will get a not-replayable 409");
                self.record(&lease, &stored::encode_unreplayable(Unreplayable::TooLarge))
                    .await;
                Ok(Reply::Handler(Response::from_parts(parts, body)))
            }
            Collected::Failed(error) => {
                tracing::error!(key = %lease.key(), %error,
                    "response body failed after the handler ran; marking the key as executed");
                self.record(
                    &lease,
                    &stored::encode_unreplayable(Unreplayable::BodyFailed),
                )
                .await;
                let problem = Problem::Internal("the response body failed");
                Ok(Reply::Whole(problem.into_response()))
            }
        }
    }

    /// Whether a response over the whole-record limit is recorded as it
    /// streams: when chunks are on and its length, if known (`Content-Length`
    /// or the body's own), is within the streamed limit. A body known to
    /// be too long is never begun in the store, so no request follows a
    /// stream that will not be recorded.
    fn streams(&self, headers: &HeaderMap, exact_len: Option<u64>) -> bool {
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        self.max_streamed_body > self.max_response_body as u64
            && declared
                .or(exact_len)
                .is_none_or(|len| len <= self.max_streamed_body)
    }

    /// For a request that waits and found its key in flight: the response
    /// being recorded under it as it streams, followed chunk by chunk, or
    /// `None` when there is none to follow (the request then waits).
    async fn follow<B>(&self, idem: &Idempotent, key: &str) -> Option<Reply<B>> {
        let stored_key = idem.key(key).ok()?;
        let follow = crate::stream::follow(idem.store().clone(), stored_key.as_str());
        match tokio::time::timeout(self.store_timeout, follow).await {
            Ok(Ok(Some((status, headers, frames)))) => {
                let mut response = stored::replay(status, headers, frames);
                applied(response.headers_mut());
                Some(Reply::Streamed(response, None))
            }
            Ok(Ok(None)) => None,
            Ok(Err(error)) => {
                tracing::warn!(key, %error, "a response being recorded cannot be followed; waiting for it instead");
                None
            }
            Err(_) => None,
        }
    }

    /// Reads the first chunk of a response recorded in chunks and returns
    /// its replay, or the problem to answer when the record cannot be read.
    async fn replay_chunks(
        &self,
        idem: &Idempotent,
        key: &str,
        manifest: idem_core::chunks::Manifest,
    ) -> Result<Frames, Problem> {
        let stored_key = idem
            .key(key)
            .map_err(|_| Problem::Internal("the idempotency layer is misconfigured"))?;
        let read = crate::stream::replay(idem.store().clone(), stored_key.as_str(), manifest);
        match tokio::time::timeout(self.store_timeout, read).await {
            Ok(Ok(frames)) => Ok(frames),
            Ok(Err(idem_core::chunks::ChunkError::Store { source, .. })) => {
                tracing::error!(key, error = %source, "idempotency store failed reading a recorded response; answering 503");
                Err(Problem::StoreUnavailable)
            }
            Ok(Err(error)) => {
                tracing::error!(key, %error, "recorded response cannot be read whole");
                Err(Problem::Internal(
                    "the recorded response for this idempotency key is damaged",
                ))
            }
            Err(_) => {
                tracing::error!(
                    key,
                    "idempotency store did not answer reading a recorded response; answering 503"
                );
                Err(Problem::StoreUnavailable)
            }
        }
    }

    /// One store call, bounded by the store timeout.
    pub(crate) async fn timed<T>(
        &self,
        call: impl IntoFuture<Output = Result<T, Error>>,
        when: When,
    ) -> Result<T, Error> {
        self.timed_for(self.store_timeout, call, when).await
    }

    /// A call bounded by `bound`. A call that is done when first polled (a
    /// store in memory, a near cache's hit) never arms a timer.
    async fn timed_for<T>(
        &self,
        bound: Duration,
        call: impl IntoFuture<Output = Result<T, Error>>,
        when: When,
    ) -> Result<T, Error> {
        let mut call = std::pin::pin!(call.into_future());
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        if let Poll::Ready(done) = first {
            return done;
        }
        match tokio::time::timeout(bound, call).await {
            Ok(done) => done,
            Err(_) => Err(Error::Store {
                source: timed_out(bound),
                when,
            }),
        }
    }

    pub(crate) async fn record(&self, lease: &Lease, payload: &[u8]) {
        self.record_with(lease, || lease.complete(payload)).await;
    }

    /// Records with `complete`, tried again after a store error while the
    /// lease holds.
    pub(crate) async fn record_with<F, Fut>(&self, lease: &Lease, complete: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        for attempt in 1..=RECORD_ATTEMPTS {
            match self.timed(complete(), When::AfterWork).await {
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

    async fn release(&self, lease: &Lease) {
        if let Err(error) = self.timed(lease.release(), When::AfterWork).await {
            tracing::warn!(key = %lease.key(), %error,
                "could not release the key; it stays claimed until its lease lapses");
        }
    }
}

/// Points the current span, the exchange's `idem.http`, to the request
/// whose response is being replayed.
fn replayed_from(original: TraceParent) {
    let span = tracing::Span::current();
    span.record(
        "idem.original_traceparent",
        tracing::field::display(original),
    );
    crate::otel::link(&span, original);
}

/// Marks a response as the answer to a request whose wait was honoured.
fn applied(headers: &mut HeaderMap) {
    headers.append(
        crate::PREFERENCE_APPLIED,
        http::HeaderValue::from_static("wait"),
    );
}

// A store that blips at the moment of recording would otherwise leave the
// key claimed until its lease lapses and then let a retry run the handler a
// second time, so recording is tried a few times while the lease still holds.
pub(crate) const RECORD_ATTEMPTS: u32 = 3;

fn timed_out(after: Duration) -> StoreError {
    StoreError::backend(
        "idem-http",
        format!("the store did not answer within {after:?}"),
    )
}

/// Whether a span or event at `level` can be enabled at all: the test
/// `tracing`'s own macros make first (false with no subscriber set).
pub(crate) fn may_trace(level: tracing::Level) -> bool {
    use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
    level <= STATIC_MAX_LEVEL && level <= LevelFilter::current()
}
