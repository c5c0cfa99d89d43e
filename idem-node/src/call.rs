//! `makeIdempotent`'s Rust half: `Guard.begin` claims a key or finds its
//! outcome over idem-core's `begin_json`; a `Call` holds the lease while the
//! JavaScript function runs, renews it, and records, remembers or releases.
//!
//! Values cross as JSON text (what `JSON.stringify` makes); idem-core
//! parses, canonicalises and fingerprints them. Every method resolves to
//! an `Outcome` rather than rejecting, so `index.js` turns each failure
//! into its documented error class.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{BeginJson, Error, HeldLease, Idempotent, Key, Lease, When};
use idem_stores::Opener;
use napi::Status;
use napi_derive::napi;
use serde_json::Value;

use crate::store::{Lazy, Store};

/// What a call into the addon found. `kind` is `run` (with `call`),
/// `replayed` or `remembered` (with `value`, JSON text), `done` (with
/// `value` for `complete`, or `message` when settling a failure went
/// wrong), or `error` (with `error`, the class name, and `message`;
/// `retryAfter` in seconds for `InProgressError`, `workRan` for
/// `StoreError`).
#[napi(object, object_from_js = false)]
pub struct Outcome {
    /// `run`, `replayed`, `remembered`, `done` or `error`.
    pub kind: String,
    /// JSON text: the recorded outcome, or the remembered failure.
    pub value: Option<String>,
    /// For `run`: the call that holds the key.
    pub call: Option<Call>,
    /// For `error`: the class `index.js` throws.
    pub error: Option<String>,
    /// What went wrong.
    pub message: Option<String>,
    /// For `InProgressError`: the time left on the holder's lease, seconds.
    pub retry_after: Option<f64>,
    /// For `StoreError`: whether the work had run.
    pub work_ran: Option<bool>,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("kind", &self.kind)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl Outcome {
    fn of(kind: &str) -> Outcome {
        Outcome {
            kind: kind.to_owned(),
            value: None,
            call: None,
            error: None,
            message: None,
            retry_after: None,
            work_ran: None,
        }
    }

    fn value(kind: &str, value: String) -> Outcome {
        Outcome {
            value: Some(value),
            ..Outcome::of(kind)
        }
    }

    fn failed(class: &str, message: String) -> Outcome {
        Outcome {
            error: Some(class.to_owned()),
            message: Some(message),
            ..Outcome::of("error")
        }
    }

    /// A failure of idem-core as the error class `index.js` throws.
    fn error(error: Error) -> Outcome {
        let message = error.to_string();
        match error {
            Error::InvalidKey(_) => Outcome::failed("InvalidKeyError", message),
            Error::Mismatch => Outcome::failed("MismatchError", message),
            Error::InProgress { retry_after } => Outcome {
                retry_after: Some(retry_after.as_secs_f64()),
                ..Outcome::failed("InProgressError", message)
            },
            Error::Store { source, when } => Outcome {
                // The store's error names the store and its cause, never a
                // password.
                work_ran: Some(when == When::AfterWork),
                ..Outcome::failed("StoreError", format!("{message}: {source}"))
            },
            Error::LeaseLost => Outcome::failed("LeaseLostError", message),
            Error::Decode(_) => Outcome::failed("DecodeError", message),
            Error::Encode(_) => Outcome::failed("EncodeError", message),
            _ => Outcome::failed("IdempotencyError", message),
        }
    }
}

/// A made-idempotent function's settings.
#[derive(Debug)]
#[napi(object)]
pub struct GuardOptions {
    /// Separates applications sharing one store.
    pub namespace: String,
    /// Seconds a crashed call blocks its key; renewed every third of it.
    pub lease: f64,
    /// Seconds an outcome is replayed.
    pub retention: f64,
    /// Seconds a call that finds the key in progress waits for its outcome.
    pub wait: Option<f64>,
}

#[derive(Clone)]
struct Settings {
    store: Arc<Lazy>,
    namespace: String,
    lease: Duration,
    retention: Duration,
    wait: Option<Duration>,
}

fn seconds(name: &str, seconds: f64) -> napi::Result<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        napi::Error::new(
            Status::InvalidArg,
            format!("{name} must be a finite, non-negative number of seconds"),
        )
    })
}

/// JSON text from `JSON.stringify`; anything else is `index.js`'s mistake.
fn parse(text: &str) -> Result<Value, Error> {
    serde_json::from_str(text).map_err(Error::Encode)
}

impl Settings {
    /// Claims `key` for `body`, or finds its outcome. The key is checked
    /// before the store is opened: an invalid key touches nothing.
    async fn begin(&self, key: String, scope: String, body: String) -> Result<Begun, Error> {
        Key::new(&self.namespace, &scope, &key)?;
        let body = parse(&body)?;
        let store = self.store.open().await.map_err(|source| Error::Store {
            source,
            when: When::BeforeWork,
        })?;
        let idem = Idempotent::from_arc(store)
            .with_namespace(self.namespace.clone())
            .with_lease(self.lease)
            .with_retention(self.retention);
        let idem = match self.wait {
            Some(wait) => idem.with_wait(wait),
            None => idem,
        };
        let idem = idem.scoped(scope);
        match idem
            .begin_json::<Value, Value, Infallible>(&key, &body)
            .await
        {
            Ok(BeginJson::Run(lease)) => Ok(Begun::Run(Running::start(lease))),
            Ok(BeginJson::Replayed(value)) => Ok(Begun::Replayed(value)),
            Err(Error::Remembered(value)) => Ok(Begun::Remembered(value)),
            Err(error) => Err(error),
        }
    }
}

enum Begun {
    Run(Running),
    Replayed(Value),
    Remembered(Value),
}

/// A claimed key whose function is running: its lease, renewed by
/// idem-core's `Lease::hold` until the call is settled. A `Call` collected
/// without an outcome drops it, and the key stays held until its lease
/// lapses.
struct Running(HeldLease);

impl Running {
    fn start(lease: Lease) -> Running {
        Running(lease.hold())
    }

    async fn complete(self, payload: Vec<u8>) -> Result<(), Error> {
        self.0.complete(&payload).await
    }

    async fn settle(self, remembered: Option<Vec<u8>>) -> Result<(), Error> {
        match remembered {
            Some(payload) => self.0.fail(&payload).await,
            None => self.0.release().await,
        }
    }
}

/// A made-idempotent function's settings; `begin` starts each call.
#[napi]
#[allow(missing_debug_implementations)]
pub struct Guard {
    settings: Settings,
}

#[napi]
impl Guard {
    /// The settings of one function over `store`.
    #[napi(constructor)]
    pub fn new(store: &Store, options: GuardOptions) -> napi::Result<Guard> {
        Ok(Guard {
            settings: Settings {
                store: Arc::clone(&store.inner),
                namespace: options.namespace,
                lease: seconds("lease", options.lease)?,
                retention: seconds("retention", options.retention)?,
                wait: options.wait.map(|w| seconds("wait", w)).transpose()?,
            },
        })
    }

    /// Claims `key` (in `scope`) for `body`, JSON text: `run` with a
    /// `Call`, `replayed` or `remembered` with the recorded JSON, or an
    /// error.
    #[napi]
    pub async fn begin(&self, key: String, scope: String, body: String) -> Outcome {
        match self.settings.begin(key, scope, body).await {
            Ok(Begun::Run(running)) => Outcome {
                call: Some(Call {
                    running: Mutex::new(Some(running)),
                }),
                ..Outcome::of("run")
            },
            Ok(Begun::Replayed(value)) => Outcome::value("replayed", value.to_string()),
            Ok(Begun::Remembered(value)) => Outcome::value("remembered", value.to_string()),
            Err(error) => Outcome::error(error),
        }
    }
}

/// One call that runs its function: the lease, until the outcome is
/// recorded, remembered or released.
#[napi]
#[allow(missing_debug_implementations)]
pub struct Call {
    running: Mutex<Option<Running>>,
}

impl Call {
    fn take(&self) -> Option<Running> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

fn settled_twice() -> Outcome {
    Outcome::failed(
        "IdempotencyError",
        "this call has already been settled".to_owned(),
    )
}

#[napi]
impl Call {
    /// Records `value` (JSON text) as the outcome, exactly as Rust's
    /// `execute` records a `serde_json::Value`; `done` with the recorded
    /// JSON. Text that is not JSON releases the key.
    #[napi]
    pub async fn complete(&self, value: String) -> Outcome {
        let Some(running) = self.take() else {
            return settled_twice();
        };
        let payload = parse(&value).and_then(|v| serde_json::to_vec(&v).map_err(Error::Encode));
        match payload {
            Ok(payload) => match running.complete(payload).await {
                Ok(()) => Outcome::value("done", value),
                Err(error) => Outcome::error(error),
            },
            Err(error) => {
                let released = running.settle(None).await;
                let mut outcome = Outcome::error(error);
                if let Err(problem) = released {
                    outcome.message = Some(format!(
                        "{}; releasing the key failed too ({problem})",
                        outcome.message.unwrap_or_default()
                    ));
                }
                outcome
            }
        }
    }

    /// Settles the key after the function threw: with `remembered` (the
    /// error's class name) and `args` (JSON text of its arguments) the
    /// failure is recorded as `{"type": …, "args": …}` and replayed to
    /// every retry; without, the key is released. `done`, with `message`
    /// saying what went wrong settling, if anything.
    #[napi]
    pub async fn fail(&self, remembered: Option<String>, args: Option<String>) -> Outcome {
        let Some(running) = self.take() else {
            return settled_twice();
        };
        let payload = remembered.map(|name| {
            let args = args
                .as_deref()
                .and_then(|text| serde_json::from_str::<Value>(text).ok())
                .unwrap_or(Value::Array(Vec::new()));
            serde_json::json!({ "type": name, "args": args })
                .to_string()
                .into_bytes()
        });
        match running.settle(payload).await {
            Ok(()) => Outcome::of("done"),
            Err(error) => Outcome {
                message: Some(error.to_string()),
                ..Outcome::of("done")
            },
        }
    }
}
