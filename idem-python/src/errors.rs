//! idem-core's errors as the package's exception classes, which live in
//! `idempotence/_errors.py` so that they carry docstrings and signatures.

use idem_core::{Error, When};
use pyo3::call::PyCallArgs;
use pyo3::prelude::*;

/// An instance of the exception class `name` of `idempotence._errors`,
/// made with `args`.
pub(crate) fn raise<'py>(py: Python<'py>, name: &str, args: impl PyCallArgs<'py>) -> PyErr {
    let made = py
        .import("idempotence._errors")
        .and_then(|errors| errors.getattr(name))
        .and_then(|class| class.call1(args));
    match made {
        Ok(error) => PyErr::from_value(error),
        Err(error) => error,
    }
}

/// A failure of idem-core as the exception the package documents. A
/// remembered failure is not handled here: the call that replays it
/// knows which classes it remembers.
pub(crate) fn to_python(py: Python<'_>, error: Error) -> PyErr {
    let message = error.to_string();
    match error {
        Error::InvalidKey(_) => raise(py, "InvalidKey", (message,)),
        Error::Mismatch => raise(py, "Mismatch", (message,)),
        Error::InProgress { retry_after } => {
            raise(py, "InProgress", (message, retry_after.as_secs_f64()))
        }
        Error::Store { source, when } => {
            // The store's error names the store and its cause.
            let full = format!("{message}: {source}");
            raise(py, "StoreError", (full, when == When::AfterWork))
        }
        Error::LeaseLost => raise(py, "LeaseLost", (message,)),
        Error::Decode(_) => raise(py, "DecodeError", (message,)),
        Error::Encode(_) => raise(py, "EncodeError", (message,)),
        _ => raise(py, "IdempotencyError", (message,)),
    }
}
