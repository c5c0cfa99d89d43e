//! gRPC for idem: tonic unary calls run at most once per idempotency key,
//! with their answer (message, status, trailers) replayed to every retry,
//! and a client layer that retries them safely.
//!
//! ```no_run
//! # use idem_tonic_testing::{Payments, PaymentsServer};
//! use idem_core::MemoryStore;
//! use idem_tonic::IdempotencyLayer;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! tonic::transport::Server::builder()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).unary("/idem.test.Payments/Charge"))
//!     .add_service(PaymentsServer::new(Payments::new()))
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! A client sends the key as `idempotency-key` metadata, or the layer
//! reads it from the request message ([`IdempotencyLayer::unary_keyed_by`],
//! for AIP-155's `request_id` and AEP-155's `idempotency_key`). On the
//! client side, [`RetryLayer`] over a tonic `Channel` gives each call one
//! key and retries it only where that is safe.
//!
//! Two callers never share a record by default. The layer has its own
//! exchange, not `idem-http`'s, so it applies `idem-http`'s rule itself,
//! with the same [`idem_http::Caller`]: a key is scoped by the caller's
//! `authorization` metadata, hashed, unless
//! [`with_scope`](IdempotencyLayer::with_scope) names the tenant.
//! [`shared_across_callers`](IdempotencyLayer::shared_across_callers) is
//! the opt-out. A call that may retry a record made before callers were
//! told apart gets `ALREADY_EXISTS`, never another caller's answer.
//!
//! [`IdempotencyLayer`] documents every status the layer answers with,
//! what it records and its fingerprint; [`stored`] the record format.
//!
//! # Why a crate of its own
//!
//! tonic, prost and an HTTP/2 stack are heavy to build, and users of the
//! HTTP middleware should not build them; and gRPC is a protocol of its
//! own over HTTP/2: its status travels in trailers, its answers to a
//! refused call are statuses rather than problem documents, and its
//! retries follow gRFC A6's pushback. So the gRPC protocol lives here
//! (framework-free in [`stored`] and the protocol functions, the tower
//! glue apart), built on `idem-core`'s claim and lease and on `idem-http`'s
//! pieces that are not HTTP semantics (the uncancellable exchange, the
//! `prefer: wait=N` parser, the hop-by-hop filter). This crate depends on
//! tonic without its transport: the server and the channel are yours.
#![forbid(unsafe_code)]

mod body;
mod client;
mod layer;
mod protocol;
mod service;
pub mod stored;

pub use body::{BoxError, ReplyBody};
pub use client::{RetryFuture, RetryLayer, RetryService};
pub use layer::{IdempotencyLayer, NAMESPACE};
pub use protocol::{fingerprint, pushback, status_of, KEY, PUSHBACK, RELEASED, REPLAYED};
pub use service::{IdempotencyService, ResponseFuture};
pub use tonic::Code;
