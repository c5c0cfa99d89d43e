//! Webhooks in, verified, queued durably, each event handled once — with
//! retries, backoff and dead letters.
//!
//! The flow: receive → [`verify`] → dedupe on (source, event id) → enqueue
//! durably on a [`queue`] → answer 2xx → a worker claims the job and runs
//! its handler under idem's `execute` keyed by the event → done, retry
//! later, or dead letter.
#![forbid(unsafe_code)]

pub mod backoff;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod handler;
pub mod queue;
pub mod ratelimit;
pub mod verify;
pub mod worker;

pub use backoff::Backoff;
pub use handler::{Event, Handler, HandlerError};
pub use ratelimit::RateLimiter;
pub use worker::{Outcome, Worker, WorkerConfig};
#[cfg(feature = "axum")]
pub mod receiver;
#[cfg(feature = "axum")]
pub use receiver::{Received, Receiver, Rejection};
