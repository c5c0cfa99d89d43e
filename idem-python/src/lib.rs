//! The `idempotence` Python package's native module, `idempotence._native`:
//! idem-core's handler-less API (`Idempotent::begin_json`, then a `Lease`
//! completed, failed or released) and idem-stores' URLs, for the
//! decorator in `python/idempotence`. Every decision (key rules,
//! fingerprints, states, waiting) is idem-core's; this crate converts
//! values and runs futures. See the README for the Python API.

mod call;
mod errors;
mod http;
mod json;
mod runtime;
mod store;

use pyo3::prelude::*;

/// The native half of the `idempotence` package.
#[pymodule(name = "_native")]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(store::open_store, module)?)?;
    module.add_class::<store::Store>()?;
    module.add_class::<call::Guard>()?;
    module.add_class::<call::Call>()?;
    module.add_class::<http::HttpOptions>()?;
    module.add_class::<http::Policy>()?;
    module.add_class::<http::Answer>()?;
    module.add_class::<http::Run>()?;
    Ok(())
}
