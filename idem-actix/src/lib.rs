//! actix-web middleware that implements the `Idempotency-Key` header, so
//! that handlers run at most once per key and retries get the recorded
//! response. The protocol is `idem-http`'s; this crate only moves requests
//! and bytes between actix-web 4 and it.
//!
//! ```
//! use actix_web::{web, App, HttpResponse};
//! use idem_actix::IdempotencyMiddleware;
//! use idem_core::MemoryStore;
//!
//! async fn create_payment(body: String) -> HttpResponse {
//!     HttpResponse::Created().body(format!("charged for {body}"))
//! }
//!
//! let app = App::new()
//!     .wrap(IdempotencyMiddleware::new(MemoryStore::new()).require_key(true))
//!     .route("/payments", web::post().to(create_payment));
//! # let _ = app;
//! ```
//!
//! It answers exactly as `idem_tower::IdempotencyLayer` does (the statuses,
//! the problem documents, the stored format), so both can share one store:
//! a response recorded through one replays through the other.
#![forbid(unsafe_code)]
// actix-web serves each connection on one worker thread, and its services,
// payloads and bodies are not `Send`; neither are the futures that hold them.
#![allow(clippy::future_not_send)]

mod body;
mod middleware;

pub use middleware::{IdempotencyMiddleware, IdempotencyService};
