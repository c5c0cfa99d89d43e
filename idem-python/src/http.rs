//! The ASGI middleware's Rust half: idem-http's handler-less exchange
//! (`Options::start`, then a `Run` the application's response is handed
//! to) as Python classes. Python reads the request body and moves the
//! response's bytes; the key, the fingerprint, the scope, the statuses,
//! problem bodies, waiting and the stored format are idem-http's.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use idem_core::store::{Store as CoreStore, StoreError};
use idem_core::Idempotent;
use idem_http::{
    Admission, Answer as HttpAnswer, AnswerBody, FingerprintPolicy, KeySource, Options,
    Run as HttpRun, Start,
};
use idem_stores::{OpenOnUse, Opener};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyList, PyTuple};

use crate::runtime::{awaitable, runtime};
use crate::store::Store;

/// A `Store` from `open_store` as idem-core's store: opened by its first
/// call in each process (so options made before a fork work in each
/// worker), a failure to open being a store failure like any other.
struct Opens(Py<Store>);

#[async_trait]
impl Opener for Opens {
    async fn open(&self) -> Result<Arc<dyn CoreStore>, StoreError> {
        self.0.get().open().await
    }

    fn opened(&self) -> Option<Arc<dyn CoreStore>> {
        self.0.get().opened()
    }
}

/// What a request's fingerprint covers (idem-http's `FingerprintPolicy`).
#[pyclass(frozen, module = "idempotence", name = "FingerprintPolicy")]
pub(crate) struct Policy(FingerprintPolicy);

/// idem-http panics on a pointer that is neither empty nor starts with
/// `/` (it would match nothing); here that is a `ValueError`.
fn pointers(what: &str, pointers: Vec<String>) -> PyResult<Vec<String>> {
    match pointers
        .iter()
        .find(|p| !p.is_empty() && !p.starts_with('/'))
    {
        Some(bad) => Err(PyValueError::new_err(format!(
            "{what}: {bad:?} is not a JSON Pointer (it must be empty or start with '/')"
        ))),
        None => Ok(pointers),
    }
}

#[pymethods]
impl Policy {
    #[new]
    #[pyo3(signature = (*, include = None, exclude = None, ignore_query = false, ignore_query_params = None))]
    fn new(
        include: Option<Vec<String>>,
        exclude: Option<Vec<String>>,
        ignore_query: bool,
        ignore_query_params: Option<Vec<String>>,
    ) -> PyResult<Policy> {
        let mut policy = FingerprintPolicy::new();
        match (include, exclude) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "a policy either includes or excludes body fields, not both",
                ));
            }
            (Some(include), None) => policy = policy.include(pointers("include", include)?),
            (None, Some(exclude)) => policy = policy.exclude(pointers("exclude", exclude)?),
            (None, None) => {}
        }
        if ignore_query && ignore_query_params.is_some() {
            return Err(PyValueError::new_err(
                "ignore_query leaves out the whole query; ignore_query_params would say nothing",
            ));
        }
        if ignore_query {
            policy = policy.ignore_query();
        }
        if let Some(names) = ignore_query_params {
            policy = policy.ignore_query_params(names);
        }
        Ok(Policy(policy))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

fn duration(name: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite, non-negative number of seconds"
        ))
    })
}

/// ASGI headers (an iterable of `(bytes, bytes)`) as a header map.
fn header_map(headers: &Bound<'_, PyAny>) -> PyResult<HeaderMap> {
    let mut map = HeaderMap::new();
    for pair in headers.try_iter()? {
        let pair = pair?;
        let (name, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair.extract()?;
        let name = name.cast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err("a header's name and value must be bytes, as ASGI has them")
        })?;
        let value = value.cast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err("a header's name and value must be bytes, as ASGI has them")
        })?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| PyValueError::new_err(format!("a header name: {e}")))?;
        let value = HeaderValue::from_bytes(value.as_bytes())
            .map_err(|e| PyValueError::new_err(format!("a header value: {e}")))?;
        map.append(name, value);
    }
    Ok(map)
}

/// A header map as ASGI headers: a list of `(bytes, bytes)`.
fn asgi_headers<'py>(py: Python<'py>, headers: &HeaderMap) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for (name, value) in headers {
        let pair = PyTuple::new(
            py,
            [
                PyBytes::new(py, name.as_str().as_bytes()),
                PyBytes::new(py, value.as_bytes()),
            ],
        )?;
        list.append(pair)?;
    }
    Ok(list)
}

fn method(method: &str) -> PyResult<Method> {
    Method::from_bytes(method.as_bytes())
        .map_err(|_| PyValueError::new_err(format!("{method:?} is not an HTTP method")))
}

/// The options of the HTTP protocol (idem-http's `Options`) over a store.
#[pyclass(frozen, module = "idempotence._native")]
pub(crate) struct HttpOptions {
    options: Options,
}

#[pymethods]
impl HttpOptions {
    #[new]
    #[pyo3(signature = (
        store, *, namespace = None, lease = None, retention = None, header = None,
        require_key = None, methods = None, max_request_body = None, max_response_body = None,
        max_streamed_body = None, record_server_errors = None, fail_open = None,
        store_timeout = None, max_wait = None, shared_across_callers = false,
        check_unscoped_records = None, key_pointer = None, policy = None, routes = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        store: Py<Store>,
        namespace: Option<String>,
        lease: Option<f64>,
        retention: Option<f64>,
        header: Option<String>,
        require_key: Option<bool>,
        methods: Option<Vec<String>>,
        max_request_body: Option<usize>,
        max_response_body: Option<usize>,
        max_streamed_body: Option<u64>,
        record_server_errors: Option<bool>,
        fail_open: Option<bool>,
        store_timeout: Option<f64>,
        max_wait: Option<f64>,
        shared_across_callers: bool,
        check_unscoped_records: Option<bool>,
        key_pointer: Option<String>,
        policy: Option<PyRef<'_, Policy>>,
        routes: Option<Vec<(String, PyRef<'_, Policy>)>>,
    ) -> PyResult<HttpOptions> {
        let mut idem = Idempotent::new(OpenOnUse::new(Arc::new(Opens(store))));
        if let Some(namespace) = namespace {
            idem = idem.with_namespace(namespace);
        }
        if let Some(lease) = lease {
            idem = idem.with_lease(duration("lease", lease)?);
        }
        if let Some(retention) = retention {
            idem = idem.with_retention(duration("retention", retention)?);
        }
        let mut options = Options::from_idempotent(idem);
        if let Some(header) = header {
            let name = HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| PyValueError::new_err(format!("{header:?} is not a header name")))?;
            options = options.with_header_name(name);
        }
        if let Some(required) = require_key {
            options = options.require_key(required);
        }
        if let Some(methods) = methods {
            let methods = methods
                .iter()
                .map(|m| method(m))
                .collect::<PyResult<Vec<_>>>()?;
            options = options.with_methods(methods);
        }
        if let Some(bytes) = max_request_body {
            options = options.with_max_request_body(bytes);
        }
        if let Some(bytes) = max_response_body {
            options = options.with_max_response_body(bytes);
        }
        if let Some(bytes) = max_streamed_body {
            options = options.with_max_streamed_body(bytes);
        }
        if let Some(record) = record_server_errors {
            options = options.record_server_errors(record);
        }
        if let Some(open) = fail_open {
            options = options.fail_open(open);
        }
        if let Some(timeout) = store_timeout {
            options = options.with_store_timeout(duration("store_timeout", timeout)?);
        }
        if let Some(wait) = max_wait {
            options = options.with_max_wait(duration("max_wait", wait)?);
        }
        if shared_across_callers {
            options = options.shared_across_callers();
        }
        if let Some(check) = check_unscoped_records {
            options = options.check_unscoped_records(check);
        }
        if let Some(pointer) = key_pointer {
            let pointer = pointers("key_pointer", vec![pointer])?.remove(0);
            options = options.with_key_source(KeySource::json_pointer(pointer));
        }
        if let Some(policy) = policy {
            options = options.with_fingerprint_policy(policy.0.clone());
        }
        for (pattern, policy) in routes.unwrap_or_default() {
            options = options
                .try_with_route_fingerprint_policy(&pattern, policy.0.clone())
                .map_err(|e| PyValueError::new_err(format!("route {pattern:?}: {e}")))?;
        }
        Ok(HttpOptions { options })
    }

    /// Whether a request with this method and these headers is protected
    /// (its body is to be read and `start` called), or passes untouched.
    fn admits(&self, method_name: &str, headers: &Bound<'_, PyAny>) -> PyResult<bool> {
        let method = method(method_name)?;
        let headers = header_map(headers)?;
        Ok(!matches!(
            self.options.admit(&method, &headers),
            Admission::Pass
        ))
    }

    /// The largest request body a protected request may carry: read up to
    /// one byte more, so `start` can refuse a longer one with 413.
    #[getter]
    fn max_request_body(&self) -> usize {
        self.options.max_request_body()
    }

    /// Decides what to do with a protected request: an awaitable of `None`
    /// (pass it to the application), an `Answer` (send it; the application
    /// does not run) or a `Run` (run the application and hand it its
    /// response). `target` is the request's path and query as sent.
    #[pyo3(signature = (method_name, target, headers, body, scope = None))]
    fn start<'py>(
        &self,
        py: Python<'py>,
        method_name: &str,
        target: &[u8],
        headers: &Bound<'py, PyAny>,
        body: &[u8],
        scope: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let method = method(method_name)?;
        let uri = Uri::try_from(target)
            .map_err(|e| PyValueError::new_err(format!("the request target: {e}")))?;
        let headers = header_map(headers)?;
        let body = Bytes::copy_from_slice(body);
        let options = self.options.clone();
        awaitable(py, async move {
            let start = options.start(&method, &uri, &headers, body, scope).await;
            Python::attach(|py| match start {
                Start::Answer(answer) => Ok(Py::new(py, Answer::of(answer))?.into_any()),
                Start::Run(run) => Ok(Py::new(py, Run(run))?.into_any()),
                _ => Ok(py.None()),
            })
        })
    }
}

/// A response for the middleware to send: a replay, a problem, or the
/// application's own response as recorded.
#[pyclass(frozen, module = "idempotence._native")]
pub(crate) struct Answer {
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

#[pymethods]
impl Answer {
    /// The status code.
    #[getter]
    fn status(&self) -> u16 {
        self.status
    }

    /// The headers, as ASGI sends them.
    #[getter]
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        asgi_headers(py, &self.headers)
    }

    /// The whole body when it is in memory; `None` when it streams (read it
    /// with `next`).
    #[getter]
    fn whole<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.body.whole().map(|body| PyBytes::new(py, &body))
    }

    /// An awaitable of the body's next frame, `None` at its end. It raises
    /// when the body fails: the response is to be cut short, so the client
    /// never sees a clean end without all of its bytes.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let next = self.body.next();
        awaitable(py, async move {
            let frame = next.await;
            Python::attach(|py| match frame {
                None => Ok(py.None()),
                Some(Ok(frame)) => Ok(PyBytes::new(py, &frame).into_any().unbind()),
                Some(Err(error)) => Err(PyRuntimeError::new_err(format!(
                    "the response body failed: {error}"
                ))),
            })
        })
    }
}

/// The application's run: its response head, its body frame by frame, and
/// the answer the client gets.
#[pyclass(frozen, module = "idempotence._native")]
pub(crate) struct Run(HttpRun);

#[pymethods]
impl Run {
    /// The application's status and headers; `False` when the exchange is
    /// past this step (a second head).
    fn respond(&self, status: u16, headers: &Bound<'_, PyAny>) -> PyResult<bool> {
        let status = StatusCode::from_u16(status)
            .map_err(|_| PyValueError::new_err(format!("{status} is not an HTTP status")))?;
        let headers = header_map(headers)?;
        Ok(self.0.respond(status, headers).is_ok())
    }

    /// Sends one body frame: `True` when it was taken, `False` when the
    /// exchange reads no more of the body (stop sending), or, while the
    /// exchange has frames unread up to its bound, an awaitable of either.
    fn send<'py>(&self, py: Python<'py>, frame: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let mut sent = Box::pin(self.0.send(Bytes::copy_from_slice(frame)));
        // A frame the queue has room for is taken at once: answered here,
        // it costs no task on the runtime and no wake-up of the event loop
        // (a whole response is one such frame). The future polled once
        // with a waker that does nothing is polled again, with the
        // runtime's, when it was not ready.
        if let Poll::Ready(sent) = sent.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            return Ok(PyBool::new(py, sent.is_ok()).to_owned().into_any());
        }
        awaitable(py, async move {
            let sent = sent.await.is_ok();
            Python::attach(|py| Ok(PyBool::new(py, sent).to_owned().into_any().unbind()))
        })
    }

    /// The body's end.
    fn end(&self) {
        self.0.end();
    }

    /// The body failed after its head: the client's response is cut short
    /// and the key is marked executed without a replayable response.
    fn fail(&self, py: Python<'_>, message: String) {
        let _entered = runtime(py).enter();
        self.0.fail(message);
    }

    /// The application failed before its head: the key is released.
    fn abort(&self) {
        self.0.abort();
    }

    /// An awaitable of the `Answer` the client gets, or `None` when the run
    /// was aborted (the middleware raises the application's error).
    fn answer<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let answer = self.0.answer();
        awaitable(py, async move {
            let answer = answer.await;
            Python::attach(|py| match answer {
                Ok(answer) => Ok(Py::new(py, Answer::of(answer))?.into_any()),
                Err(_) => Ok(py.None()),
            })
        })
    }
}
