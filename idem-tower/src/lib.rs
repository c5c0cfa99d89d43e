//! Tower middleware that implements the `Idempotency-Key` header, so that
//! axum and hyper handlers run at most once per key and retries get the
//! recorded response.
//!
//! ```
//! use axum::{routing::post, Router};
//! use idem_core::MemoryStore;
//! use idem_tower::IdempotencyLayer;
//!
//! async fn create_payment(body: String) -> (axum::http::StatusCode, String) {
//!     (axum::http::StatusCode::CREATED, format!("charged for {body}"))
//! }
//!
//! let app: Router = Router::new()
//!     .route("/payments", post(create_payment))
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).require_key(true));
//! # let _ = app;
//! ```
//!
//! [`IdempotencyLayer`] documents every status the middleware answers with,
//! what it records, and its stored format. With plain hyper, wrap a tower
//! service taking `Request<`[`RequestBody`]`>` with the layer and serve it
//! through `hyper_util::service::TowerToHyperService`.
#![forbid(unsafe_code)]

mod body;
mod layer;
mod service;

pub use body::{BoxError, RequestBody, ResponseBody};
pub use idem_http::Options;
pub use layer::IdempotencyLayer;
pub use service::{IdempotencyService, ResponseFuture};
