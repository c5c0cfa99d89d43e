//! The `idempotence` npm package's native addon: idem-core's handler-less
//! API (`Idempotent::begin_json`, then a `Lease` completed, failed or
//! released) and idem-stores' URLs, for `makeIdempotent` in `index.js`.
//! Every decision (key rules, canonical fingerprints, states, waiting) is
//! idem-core's; this crate moves JSON text and runs futures on the tokio
//! runtime napi-rs keeps, settling each Promise on the event loop.

mod call;
mod http;
mod store;

pub use call::{Call, Guard, GuardOptions, Outcome};
pub use http::{Answer, HttpOptions, HttpOptionsInit, Policy, Run, Started};
pub use store::{open_store, Store};
