//! Python values to JSON and back: the plain data conversion the package
//! needs to hand idem-core a `serde_json::Value`. Canonical forms and
//! fingerprints are idem-core's.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

// serde_json refuses to parse nesting deeper than 128, so a deeper value
// would be recorded but could never be replayed.
const DEEPEST: usize = 127;

/// `value` as JSON: `None`, `bool`, `int` (within 64 bits), finite `float`,
/// `str`, `dict` with `str` keys, `list` and `tuple`. Anything else goes
/// through `idempotence._plain.plain` (dataclasses, pydantic models) once,
/// or is a `TypeError` naming its type.
pub(crate) fn to_json(value: &Bound<'_, PyAny>) -> PyResult<Value> {
    let plain = value.py().import("idempotence._plain")?.getattr("plain")?;
    convert(value, &plain, 0)
}

fn convert(value: &Bound<'_, PyAny>, plain: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > DEEPEST {
        return Err(PyTypeError::new_err(format!(
            "nested deeper than {DEEPEST} levels; JSON readers refuse it"
        )));
    }
    if value.is_none() {
        return Ok(Value::Null);
    }
    // `bool` is a subclass of `int`: asked first.
    if let Ok(flag) = value.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if value.cast::<PyInt>().is_ok() {
        if let Ok(int) = value.extract::<i64>() {
            return Ok(Value::from(int));
        }
        if let Ok(int) = value.extract::<u64>() {
            return Ok(Value::from(int));
        }
        return Err(PyTypeError::new_err(
            "an int outside 64 bits is not stored as JSON; pass it as a str",
        ));
    }
    if let Ok(float) = value.cast::<PyFloat>() {
        return Number::from_f64(float.value())
            .map(Value::Number)
            .ok_or_else(|| PyTypeError::new_err("NaN and infinity are not JSON"));
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(Value::String(text.to_cow()?.into_owned()));
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut map = Map::new();
        for (name, item) in dict.iter() {
            let Ok(name) = name.cast::<PyString>() else {
                return Err(PyTypeError::new_err(format!(
                    "a dict key of type {} is not JSON; JSON keys are str",
                    type_name(&name)
                )));
            };
            map.insert(
                name.to_cow()?.into_owned(),
                convert(&item, plain, depth + 1)?,
            );
        }
        return Ok(Value::Object(map));
    }
    if let Ok(list) = value.cast::<PyList>() {
        return list
            .iter()
            .map(|item| convert(&item, plain, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    if let Ok(tuple) = value.cast::<PyTuple>() {
        return tuple
            .iter()
            .map(|item| convert(&item, plain, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    // A dataclass or a pydantic model becomes plain data in Python; its
    // fields are converted here like any other value.
    let converted = plain.call1((value,))?;
    convert(&converted, plain, depth + 1)
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |name| name.to_string())
}

/// A recorded JSON value as Python: `dict`, `list`, `str`, `int`,
/// `float`, `bool` or `None`.
pub(crate) fn to_python(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(flag) => PyBool::new(py, *flag).to_owned().into_any().unbind(),
        Value::Number(number) => {
            if let Some(int) = number.as_i64() {
                int.into_pyobject(py)?.into_any().unbind()
            } else if let Some(int) = number.as_u64() {
                int.into_pyobject(py)?.into_any().unbind()
            } else {
                number
                    .as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()
            }
        }
        Value::String(text) => PyString::new(py, text).into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_python(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (name, item) in map {
                dict.set_item(name, to_python(py, item)?)?;
            }
            dict.into_any().unbind()
        }
    })
}
