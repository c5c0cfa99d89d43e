//! The `node:http` wrapper's and the Express middleware's Rust half:
//! idem-http's handler-less exchange (`Options::start`, then a `Run` the
//! application's response is handed to). JavaScript reads the request body
//! and moves the response's bytes; the key, the fingerprint, the scope, the
//! statuses, problem bodies, waiting and the stored format are idem-http's.
//!
//! Headers cross as Node's raw form, a flat array of names and values.
//! Node decodes header bytes as Latin-1, so each character is one byte:
//! the bytes recorded are the bytes sent.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use idem_core::Idempotent;
use idem_http::{
    Admission, Answer as HttpAnswer, AnswerBody, FingerprintPolicy, KeySource, Options,
    Run as HttpRun, Start,
};
use napi::bindgen_prelude::{Buffer, Either, PromiseRaw};
use napi::{Env, Error, Status};
use napi_derive::napi;

use idem_stores::OpenOnUse;

use crate::store::Store;

fn invalid(message: String) -> Error {
    Error::new(Status::InvalidArg, message)
}

fn duration(name: &str, seconds: f64) -> napi::Result<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        invalid(format!(
            "{name} must be a finite, non-negative number of seconds"
        ))
    })
}

/// A header as Node holds it (Latin-1 text) back into its bytes.
fn latin1(text: &str) -> napi::Result<Vec<u8>> {
    text.chars()
        .map(|c| u8::try_from(u32::from(c)).ok())
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| invalid("a header holds a character outside Latin-1".to_owned()))
}

/// Node's raw headers (`[name, value, name, value, …]`) as a header map.
fn header_map(raw: &[String]) -> napi::Result<HeaderMap> {
    if raw.len() % 2 != 0 {
        return Err(invalid(
            "headers are a flat array of names and values".to_owned(),
        ));
    }
    let mut map = HeaderMap::new();
    for pair in raw.chunks(2) {
        let name = HeaderName::from_bytes(&latin1(&pair[0])?)
            .map_err(|_| invalid(format!("{:?} is not a header name", pair[0])))?;
        let value = HeaderValue::from_bytes(&latin1(&pair[1])?)
            .map_err(|_| invalid(format!("the value of header {name} is not valid")))?;
        map.append(name, value);
    }
    Ok(map)
}

/// A header map as Node's raw headers, each byte one Latin-1 character.
fn raw_headers(headers: &HeaderMap) -> Vec<String> {
    let mut raw = Vec::with_capacity(headers.len() * 2);
    for (name, value) in headers {
        raw.push(name.as_str().to_owned());
        raw.push(value.as_bytes().iter().map(|&b| char::from(b)).collect());
    }
    raw
}

fn method(method: &str) -> napi::Result<Method> {
    Method::from_bytes(method.as_bytes())
        .map_err(|_| invalid(format!("{method:?} is not an HTTP method")))
}

/// What a request's fingerprint covers (idem-http's `FingerprintPolicy`).
#[derive(Debug)]
#[napi(object)]
pub struct Policy {
    /// JSON Pointers of the only body fields fingerprinted.
    pub include: Option<Vec<String>>,
    /// JSON Pointers of body fields left out of the fingerprint.
    pub exclude: Option<Vec<String>>,
    /// Leaves the whole query string out.
    pub ignore_query: Option<bool>,
    /// Query parameters left out.
    pub ignore_query_params: Option<Vec<String>>,
}

/// idem-http panics on a pointer that is neither empty nor starts with
/// `/` (it would match nothing); here that is an error.
fn pointers(what: &str, pointers: Vec<String>) -> napi::Result<Vec<String>> {
    match pointers
        .iter()
        .find(|p| !p.is_empty() && !p.starts_with('/'))
    {
        Some(bad) => Err(invalid(format!(
            "{what}: {bad:?} is not a JSON Pointer (it must be empty or start with '/')"
        ))),
        None => Ok(pointers),
    }
}

impl Policy {
    fn build(self) -> napi::Result<FingerprintPolicy> {
        let mut policy = FingerprintPolicy::new();
        match (self.include, self.exclude) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "a policy either includes or excludes body fields, not both".to_owned(),
                ));
            }
            (Some(include), None) => policy = policy.include(pointers("include", include)?),
            (None, Some(exclude)) => policy = policy.exclude(pointers("exclude", exclude)?),
            (None, None) => {}
        }
        let ignore_query = self.ignore_query.unwrap_or(false);
        if ignore_query && self.ignore_query_params.is_some() {
            return Err(invalid(
                "ignoreQuery leaves out the whole query; ignoreQueryParams would say nothing"
                    .to_owned(),
            ));
        }
        if ignore_query {
            policy = policy.ignore_query();
        }
        if let Some(names) = self.ignore_query_params {
            policy = policy.ignore_query_params(names);
        }
        Ok(policy)
    }
}

/// The HTTP protocol's settings (idem-http's `Options`); every one is
/// optional and defaults as in Rust.
#[derive(Debug)]
#[napi(object)]
pub struct HttpOptionsInit {
    /// Separates applications sharing one store.
    pub namespace: Option<String>,
    /// Seconds a crashed request blocks its key.
    pub lease: Option<f64>,
    /// Seconds a response is replayed.
    pub retention: Option<f64>,
    /// The key's header, `Idempotency-Key` by default.
    pub header: Option<String>,
    /// Refuses a protected request without a key with 400.
    pub require_key: Option<bool>,
    /// The protected methods, POST and PATCH by default.
    pub methods: Option<Vec<String>>,
    /// The largest request body, bytes.
    pub max_request_body: Option<u32>,
    /// The largest response body recorded whole, bytes.
    pub max_response_body: Option<u32>,
    /// The largest response body recorded in chunks, bytes.
    pub max_streamed_body: Option<f64>,
    /// Records 5xx responses too.
    pub record_server_errors: Option<bool>,
    /// Runs the application unprotected when the store fails.
    pub fail_open: Option<bool>,
    /// Seconds one store call may take.
    pub store_timeout: Option<f64>,
    /// The longest wait a client may ask for, seconds.
    pub max_wait: Option<f64>,
    /// Keys are not scoped by the caller.
    pub shared_across_callers: Option<bool>,
    /// Whether a caller-scoped request checks for an unscoped record.
    pub check_unscoped_records: Option<bool>,
    /// A JSON Pointer to the key in a JSON body, instead of a header.
    pub key_pointer: Option<String>,
    /// What the fingerprint covers.
    pub policy: Option<Policy>,
    /// Route patterns (`/payments/{id}`) with their own policies, the first
    /// match deciding.
    pub routes: Option<Vec<RoutePolicy>>,
}

/// A fingerprint policy for requests whose path matches `pattern`.
#[derive(Debug)]
#[napi(object)]
pub struct RoutePolicy {
    /// `{id}` (or `*`) matches one segment, a last `**` any rest.
    pub pattern: String,
    /// Its policy.
    pub policy: Policy,
}

fn build(store: &Store, init: HttpOptionsInit) -> napi::Result<Options> {
    let mut idem = Idempotent::new(OpenOnUse::new(Arc::clone(&store.inner)));
    if let Some(namespace) = init.namespace {
        idem = idem.with_namespace(namespace);
    }
    if let Some(lease) = init.lease {
        idem = idem.with_lease(duration("lease", lease)?);
    }
    if let Some(retention) = init.retention {
        idem = idem.with_retention(duration("retention", retention)?);
    }
    let mut options = Options::from_idempotent(idem);
    if let Some(header) = init.header {
        let name = HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| invalid(format!("{header:?} is not a header name")))?;
        options = options.with_header_name(name);
    }
    if let Some(required) = init.require_key {
        options = options.require_key(required);
    }
    if let Some(methods) = init.methods {
        let methods = methods
            .iter()
            .map(|m| method(m))
            .collect::<napi::Result<Vec<_>>>()?;
        options = options.with_methods(methods);
    }
    if let Some(bytes) = init.max_request_body {
        options = options.with_max_request_body(bytes as usize);
    }
    if let Some(bytes) = init.max_response_body {
        options = options.with_max_response_body(bytes as usize);
    }
    if let Some(bytes) = init.max_streamed_body {
        if !(bytes.is_finite() && bytes >= 0.0) {
            return Err(invalid("maxStreamedBody must be a byte count".to_owned()));
        }
        // A finite, non-negative f64 saturates into u64.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let bytes = bytes as u64;
        options = options.with_max_streamed_body(bytes);
    }
    if let Some(record) = init.record_server_errors {
        options = options.record_server_errors(record);
    }
    if let Some(open) = init.fail_open {
        options = options.fail_open(open);
    }
    if let Some(timeout) = init.store_timeout {
        options = options.with_store_timeout(duration("storeTimeout", timeout)?);
    }
    if let Some(wait) = init.max_wait {
        options = options.with_max_wait(duration("maxWait", wait)?);
    }
    if init.shared_across_callers == Some(true) {
        options = options.shared_across_callers();
    }
    if let Some(check) = init.check_unscoped_records {
        options = options.check_unscoped_records(check);
    }
    if let Some(pointer) = init.key_pointer {
        let pointer = pointers("keyPointer", vec![pointer])?.remove(0);
        options = options.with_key_source(KeySource::json_pointer(pointer));
    }
    if let Some(policy) = init.policy {
        options = options.with_fingerprint_policy(policy.build()?);
    }
    for route in init.routes.unwrap_or_default() {
        let pattern = route.pattern;
        options = options
            .try_with_route_fingerprint_policy(&pattern, route.policy.build()?)
            .map_err(|e| invalid(format!("route {pattern:?}: {e}")))?;
    }
    Ok(options)
}

/// The HTTP protocol over a store.
#[napi]
#[allow(missing_debug_implementations)]
pub struct HttpOptions {
    options: Options,
}

/// What `start` decided: `pass` (hand the request to the application),
/// `answer` (send it; the application does not run) or `run` (run the
/// application and hand its response to `run`).
#[napi(object, object_from_js = false)]
#[allow(missing_debug_implementations)]
pub struct Started {
    /// `pass`, `answer` or `run`.
    pub kind: String,
    /// For `answer`.
    pub answer: Option<Answer>,
    /// For `run`.
    pub run: Option<Run>,
}

#[napi]
impl HttpOptions {
    /// The protocol's settings over `store`.
    #[napi(constructor)]
    pub fn new(store: &Store, init: Option<HttpOptionsInit>) -> napi::Result<HttpOptions> {
        let init = init.unwrap_or(HttpOptionsInit {
            namespace: None,
            lease: None,
            retention: None,
            header: None,
            require_key: None,
            methods: None,
            max_request_body: None,
            max_response_body: None,
            max_streamed_body: None,
            record_server_errors: None,
            fail_open: None,
            store_timeout: None,
            max_wait: None,
            shared_across_callers: None,
            check_unscoped_records: None,
            key_pointer: None,
            policy: None,
            routes: None,
        });
        Ok(HttpOptions {
            options: build(store, init)?,
        })
    }

    /// Whether a request with this method and these raw headers is
    /// protected (its body is to be read and `start` called).
    #[napi]
    pub fn admits(&self, method_name: String, headers: Vec<String>) -> napi::Result<bool> {
        let method = method(&method_name)?;
        let headers = header_map(&headers)?;
        Ok(!matches!(
            self.options.admit(&method, &headers),
            Admission::Pass
        ))
    }

    /// The largest request body a protected request may carry: read up to
    /// one byte more, so `start` can refuse a longer one with 413.
    #[napi(getter)]
    pub fn max_request_body(&self) -> f64 {
        self.options.max_request_body() as f64
    }

    /// Decides what to do with a protected request. `target` is its path
    /// and query as sent, `headers` Node's raw headers, `scope` the
    /// application's principal (none: the caller as idem-http reads it).
    #[napi]
    pub async fn start(
        &self,
        method_name: String,
        target: String,
        headers: Vec<String>,
        body: Buffer,
        scope: Option<String>,
    ) -> napi::Result<Started> {
        let method = method(&method_name)?;
        let uri = Uri::try_from(target.as_str())
            .map_err(|e| invalid(format!("the request target: {e}")))?;
        let headers = header_map(&headers)?;
        let body = Bytes::copy_from_slice(&body);
        let start = self
            .options
            .start(&method, &uri, &headers, body, scope)
            .await;
        Ok(match start {
            Start::Answer(answer) => Started {
                kind: "answer".to_owned(),
                answer: Some(Answer::of(answer)),
                run: None,
            },
            Start::Run(run) => Started {
                kind: "run".to_owned(),
                answer: None,
                run: Some(Run(run)),
            },
            _ => Started {
                kind: "pass".to_owned(),
                answer: None,
                run: None,
            },
        })
    }
}

/// A response to send: a replay, a problem, or the application's own
/// response as recorded.
#[napi]
#[allow(missing_debug_implementations)]
pub struct Answer {
    status: u16,
    headers: HeaderMap,
    body: AnswerBody,
}

impl Answer {
    fn of(answer: HttpAnswer) -> Answer {
        Answer {
            status: answer.status.as_u16(),
            headers: answer.headers,
            body: answer.body,
        }
    }
}

#[napi]
impl Answer {
    /// The status code.
    #[napi(getter)]
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The headers, as Node's raw headers.
    #[napi(getter)]
    pub fn headers(&self) -> Vec<String> {
        raw_headers(&self.headers)
    }

    /// The whole body when it is in memory; null when it streams (read it
    /// with `next`).
    #[napi(getter)]
    pub fn whole(&self) -> Option<Buffer> {
        self.body.whole().map(|body| Buffer::from(body.to_vec()))
    }

    /// The body's next frame, null at its end. It rejects when the body
    /// fails: the response is to be cut short, so the client never sees a
    /// clean end without all of its bytes.
    #[napi]
    pub async fn next(&self) -> napi::Result<Option<Buffer>> {
        match self.body.next().await {
            None => Ok(None),
            Some(Ok(frame)) => Ok(Some(Buffer::from(frame.to_vec()))),
            Some(Err(error)) => Err(Error::new(
                Status::GenericFailure,
                format!("the response body failed: {error}"),
            )),
        }
    }
}

/// The application's run: its response head, its body frame by frame, and
/// the answer the client gets.
#[napi]
#[allow(missing_debug_implementations)]
pub struct Run(HttpRun);

#[napi]
impl Run {
    /// The application's status and raw headers; false when the exchange
    /// is past this step (a second head).
    #[napi]
    pub fn respond(&self, status: u16, headers: Vec<String>) -> napi::Result<bool> {
        let status = StatusCode::from_u16(status)
            .map_err(|_| invalid(format!("{status} is not an HTTP status")))?;
        let headers = header_map(&headers)?;
        Ok(self.0.respond(status, headers).is_ok())
    }

    /// Sends one body frame: true when it was taken, false when the
    /// exchange reads no more of the body (stop sending), or, while the
    /// exchange has frames unread up to its bound, a Promise of either.
    #[napi(ts_return_type = "boolean | Promise<boolean>")]
    pub fn send<'env>(
        &self,
        env: &'env Env,
        frame: Buffer,
    ) -> napi::Result<Either<bool, PromiseRaw<'env, bool>>> {
        let mut sent = Box::pin(self.0.send(Bytes::copy_from_slice(&frame)));
        // A frame the queue has room for is taken at once: answered here,
        // it costs no task on the runtime and no wake-up of the event loop
        // (a whole response is one such frame). The future polled once
        // with a waker that does nothing is polled again, with the
        // runtime's, when it was not ready.
        if let Poll::Ready(sent) = sent.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            return Ok(Either::A(sent.is_ok()));
        }
        env.spawn_future(async move { Ok(sent.await.is_ok()) })
            .map(Either::B)
    }

    /// The body's end.
    #[napi]
    pub fn end(&self) {
        self.0.end();
    }

    /// The body failed after its head: the client's response is cut short
    /// and the key is marked executed without a replayable response.
    #[napi]
    pub async fn fail(&self, message: String) {
        self.0.fail(message);
    }

    /// The application failed before its head: the key is released.
    #[napi]
    pub fn abort(&self) {
        self.0.abort();
    }

    /// The answer the client gets, or null when the run was aborted (the
    /// binding answers with the application's error).
    #[napi]
    pub async fn answer(&self) -> Option<Answer> {
        self.0.answer().await.ok().map(Answer::of)
    }
}
