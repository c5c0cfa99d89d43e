//! The decorator's Rust half: `Guard.begin` claims a key or finds its
//! outcome over idem-core's `begin_json`; a `Call` holds the lease while the
//! Python function runs, renews it, and records, remembers or releases.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::Store as CoreStore;
use idem_core::{BeginJson, Error, HeldLease, Idempotent, Key, Lease, When};
use pyo3::exceptions::{PyException, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use serde_json::Value;

use crate::errors::{self, raise};
use crate::json;
use crate::runtime::{awaitable, block_on, Active};
use crate::store::Store;

/// The settings of one decorated function.
#[derive(Clone)]
struct Settings {
    store: Arc<Py<Store>>,
    namespace: String,
    lease: Duration,
    retention: Duration,
    wait: Option<Duration>,
}

impl Settings {
    fn idempotent(&self, store: Arc<dyn CoreStore>, scope: String) -> Idempotent {
        let idem = Idempotent::from_arc(store)
            .with_namespace(self.namespace.clone())
            .with_lease(self.lease)
            .with_retention(self.retention);
        let idem = match self.wait {
            Some(wait) => idem.with_wait(wait),
            None => idem,
        };
        idem.scoped(scope)
    }

    /// Claims `key` for `body`, or finds its outcome. The key is checked
    /// before the store is opened: an invalid key touches nothing.
    async fn begin(
        &self,
        active: &Active,
        key: String,
        scope: String,
        body: Value,
    ) -> Result<Begun, Error> {
        Key::new(&self.namespace, &scope, &key)?;
        let store = self
            .store
            .get()
            .open()
            .await
            .map_err(|source| Error::Store {
                source,
                when: When::BeforeWork,
            })?;
        let idem = self.idempotent(store, scope);
        match idem
            .begin_json::<Value, Value, Infallible>(&key, &body)
            .await
        {
            Ok(BeginJson::Run(lease)) => Ok(Begun::Run(Running::start(lease, active.also()))),
            Ok(BeginJson::Replayed(value)) => Ok(Begun::Replayed(value)),
            Err(Error::Remembered(value)) => Ok(Begun::Remembered(value)),
            Err(error) => Err(error),
        }
    }
}

/// What a claim found.
enum Begun {
    Run(Running),
    Replayed(Value),
    Remembered(Value),
}

/// A claimed key whose function is running: its lease, renewed by
/// idem-core's `Lease::hold` until the call is settled.
struct Running {
    held: HeldLease,
    // A fork while the lease is held leaves the threads running.
    _active: Active,
}

impl Running {
    /// Starts renewing the lease; call it on the runtime.
    fn start(lease: Lease, active: Active) -> Running {
        Running {
            held: lease.hold(),
            _active: active,
        }
    }

    /// Records `payload` as the outcome.
    async fn complete(self, payload: Vec<u8>) -> Result<(), Error> {
        self.held.complete(&payload).await
    }

    /// Records `payload` as a remembered failure, or releases the key.
    async fn settle(self, remembered: Option<Vec<u8>>) -> Result<(), Error> {
        match remembered {
            Some(payload) => self.held.fail(&payload).await,
            None => self.held.release().await,
        }
    }
}

/// A decorated function's settings; `begin` starts each call.
#[pyclass(frozen, module = "idempotence._native")]
pub(crate) struct Guard {
    settings: Settings,
    remember: Py<PyTuple>,
}

fn duration(name: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite, non-negative number of seconds"
        ))
    })
}

fn client_key(key: &Bound<'_, PyAny>) -> PyResult<String> {
    match key.cast::<PyString>() {
        Ok(key) => Ok(key.to_cow()?.into_owned()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "the idempotency key must be a str, not {}",
            key.get_type().name()?
        ))),
    }
}

#[pymethods]
impl Guard {
    #[new]
    #[pyo3(signature = (store, *, namespace, lease, retention, wait, remember))]
    fn new(
        store: Py<Store>,
        namespace: String,
        lease: f64,
        retention: f64,
        wait: Option<f64>,
        remember: Py<PyTuple>,
    ) -> PyResult<Guard> {
        Ok(Guard {
            settings: Settings {
                store: Arc::new(store),
                namespace,
                lease: duration("lease", lease)?,
                retention: duration("retention", retention)?,
                wait: wait.map(|wait| duration("wait", wait)).transpose()?,
            },
            remember,
        })
    }

    /// Claims `key` for `body`, releasing the GIL while the store answers.
    /// Returns `(True, outcome)` for a recorded outcome, `(False, call)`
    /// when the function is to run, and raises a remembered failure.
    fn begin(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        scope: String,
        body: &Bound<'_, PyAny>,
    ) -> PyResult<(bool, Py<PyAny>)> {
        let key = client_key(key)?;
        let body = body_json(body)?;
        let settings = self.settings.clone();
        let active = Active::enter(py);
        let begun = block_on(py, async move {
            settings.begin(&active, key, scope, body).await
        });
        self.answer(py, begun)
    }

    /// `begin` as an awaitable, run on tokio.
    fn begin_async<'py>(
        slf: Bound<'py, Guard>,
        key: &Bound<'py, PyAny>,
        scope: String,
        body: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let key = client_key(key)?;
        let body = body_json(body)?;
        let settings = slf.get().settings.clone();
        let guard = slf.unbind();
        let active = Active::enter(py);
        awaitable(py, async move {
            let begun = settings.begin(&active, key, scope, body).await;
            Python::attach(|py| {
                let answer = guard.get().answer(py, begun)?;
                answer
                    .into_pyobject(py)
                    .map(|tuple| tuple.into_any().unbind())
            })
        })
    }
}

/// The call's arguments as JSON; a body that is not JSON never reaches
/// the store.
fn body_json(body: &Bound<'_, PyAny>) -> PyResult<Value> {
    json::to_json(body).map_err(|cause| {
        let error = raise(
            body.py(),
            "EncodeError",
            (format!(
                "the arguments that make the request are not JSON ({cause}); \
                 nothing was claimed and the function did not run"
            ),),
        );
        error.set_cause(body.py(), Some(cause));
        error
    })
}

impl Guard {
    fn answer(&self, py: Python<'_>, begun: Result<Begun, Error>) -> PyResult<(bool, Py<PyAny>)> {
        match begun {
            Ok(Begun::Replayed(value)) => Ok((true, json::to_python(py, &value)?)),
            Ok(Begun::Run(running)) => {
                let call = Call {
                    running: Mutex::new(Some(running)),
                    remember: self.remember.clone_ref(py),
                };
                Ok((false, Py::new(py, call)?.into_any()))
            }
            Ok(Begun::Remembered(value)) => Err(remembered(py, self.remember.bind(py), value)),
            Err(error) => Err(errors::to_python(py, error)),
        }
    }
}

/// The stored form of a remembered exception: its class's qualified name
/// and its arguments (or its message, when they are not JSON).
fn remembered_payload(error: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let class = error.get_type();
    let name = format!("{}.{}", class.module()?, class.qualname()?);
    let args = match error.getattr("args").and_then(|args| json::to_json(&args)) {
        Ok(args) => args,
        Err(_) => Value::Array(vec![Value::String(error.str()?.to_cow()?.into_owned())]),
    };
    let payload = serde_json::json!({ "type": name, "args": args });
    serde_json::to_vec(&payload).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// A remembered failure as the exception to raise: the remembered class
/// of that name made again with its arguments, or `Remembered` when no
/// class of the decorator's has that name (another program recorded it).
fn remembered(py: Python<'_>, classes: &Bound<'_, PyTuple>, value: Value) -> PyErr {
    let name = value.get("type").and_then(Value::as_str);
    let args = value.get("args").and_then(Value::as_array);
    if let (Some(name), Some(args)) = (name, args) {
        for class in classes.iter() {
            let Ok(class) = class.cast::<pyo3::types::PyType>() else {
                continue;
            };
            let matches = class
                .module()
                .and_then(|module| Ok(format!("{module}.{}", class.qualname()?)))
                .is_ok_and(|qualified| qualified == name);
            if !matches {
                continue;
            }
            let made = args
                .iter()
                .map(|arg| json::to_python(py, arg))
                .collect::<PyResult<Vec<_>>>()
                .and_then(|args| class.call1(PyTuple::new(py, args)?));
            if let Ok(error) = made {
                return PyErr::from_value(error);
            }
        }
    }
    let shown = value.to_string();
    match json::to_python(py, &value) {
        Ok(value) => raise(
            py,
            "Remembered",
            (
                format!(
                    "an earlier call under this key failed and its failure is remembered: {shown}"
                ),
                value,
            ),
        ),
        Err(error) => error,
    }
}

/// One call that runs its function: the lease, until the outcome is
/// recorded, remembered or released.
#[pyclass(frozen, module = "idempotence._native")]
pub(crate) struct Call {
    running: Mutex<Option<Running>>,
    remember: Py<PyTuple>,
}

/// What `fail` does with an exception.
enum Failure {
    /// Not an `Exception` (a cancellation, `KeyboardInterrupt`): like a
    /// dropped future in Rust, the key stays claimed until its lease lapses,
    /// because the side effect may have happened.
    Abandon,
    Settle(Option<Vec<u8>>),
}

impl Call {
    fn take(&self) -> PyResult<Running> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("this call has already been settled"))
    }

    fn failure(&self, error: &Bound<'_, PyAny>) -> PyResult<Failure> {
        let py = error.py();
        if !error.is_instance(&py.get_type::<PyException>())? {
            return Ok(Failure::Abandon);
        }
        if error.is_instance(self.remember.bind(py).as_any())? {
            return Ok(Failure::Settle(Some(remembered_payload(error)?)));
        }
        Ok(Failure::Settle(None))
    }
}

/// The outcome as recorded bytes, or the error that releases the key.
fn outcome(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let json = json::to_json(value)?;
    serde_json::to_vec(&json).map_err(|e| PyTypeError::new_err(e.to_string()))
}

/// The error for a return value that is not JSON, once the key is
/// released (or could not be).
fn not_json(py: Python<'_>, cause: PyErr, released: Result<(), Error>) -> PyErr {
    let released = match released {
        Ok(()) => "the key was released, so a retry runs the function again".to_owned(),
        Err(error) => {
            format!("releasing the key failed too ({error}); it is held until its lease lapses")
        }
    };
    let error = raise(
        py,
        "EncodeError",
        (format!("the function's return value is not JSON ({cause}); nothing was recorded and {released}"),),
    );
    error.set_cause(py, Some(cause));
    error
}

/// What went wrong settling the key after the function raised, for a log
/// line: the function's own exception is what the caller sees.
fn settled(result: Result<(), Error>) -> Option<String> {
    result.err().map(|error| error.to_string())
}

#[pymethods]
impl Call {
    /// Records `value` (as JSON) as the outcome and returns it. A value that
    /// is not JSON releases the key and raises `EncodeError`.
    fn complete(&self, py: Python<'_>, value: Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let running = self.take()?;
        match outcome(&value) {
            Ok(payload) => {
                block_on(py, running.complete(payload)).map_err(|e| errors::to_python(py, e))?;
                Ok(value.unbind())
            }
            Err(cause) => {
                let released = block_on(py, running.settle(None));
                Err(not_json(py, cause, released))
            }
        }
    }

    /// `complete` as an awaitable.
    fn complete_async<'py>(&self, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = value.py();
        let running = self.take()?;
        let payload = outcome(&value);
        let value = value.unbind();
        awaitable(py, async move {
            match payload {
                Ok(payload) => {
                    let recorded = running.complete(payload).await;
                    Python::attach(|py| {
                        recorded
                            .map(|()| value)
                            .map_err(|e| errors::to_python(py, e))
                    })
                }
                Err(cause) => {
                    let released = running.settle(None).await;
                    Python::attach(|py| Err(not_json(py, cause, released)))
                }
            }
        })
    }

    /// Settles the key after the function raised `error`: a remembered
    /// class is recorded, another `Exception` releases the key, anything
    /// else (a cancellation) leaves it held until its lease lapses. Returns
    /// what went wrong settling, if anything.
    fn fail(&self, py: Python<'_>, error: Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let running = self.take()?;
        Ok(match self.failure(&error)? {
            Failure::Abandon => {
                block_on(py, running.held.abandon());
                None
            }
            Failure::Settle(remembered) => settled(block_on(py, running.settle(remembered))),
        })
    }

    /// `fail` as an awaitable.
    fn fail_async<'py>(&self, error: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = error.py();
        let running = self.take()?;
        let failure = self.failure(&error)?;
        awaitable(py, async move {
            let problem = match failure {
                Failure::Abandon => {
                    running.held.abandon().await;
                    None
                }
                Failure::Settle(remembered) => settled(running.settle(remembered).await),
            };
            Python::attach(|py| match problem {
                Some(problem) => Ok(PyString::new(py, &problem).into_any().unbind()),
                None => Ok(py.None()),
            })
        })
    }
}
