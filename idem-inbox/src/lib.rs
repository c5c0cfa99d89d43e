//! Webhooks in, verified, queued durably, each event handled once — with
//! retries, backoff and dead letters.
//!
//! The flow: receive → [`verify`] → dedupe on (source, event id), and on
//! the body's digest where the signature covers neither the id nor a
//! timestamp → enqueue durably on a [`queue`] → answer 2xx → a [`Worker`]
//! claims the job and runs its [`Handler`] under idem's `execute` keyed by
//! the event → done, retry later with
//! [`Backoff`](idem_core::backoff::Backoff), or dead letter.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_core::{Idempotent, MemoryStore};
//! use idem_inbox::{queue::SqliteQueue, verify::StandardWebhooks, Event, HandlerError, Receiver, Worker};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let queue = Arc::new(SqliteQueue::open("inbox.db").await?); // durable, embedded
//!     let verifier = StandardWebhooks::new(["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"])?;
//!     let receiver = Receiver::new("acme", verifier, queue.clone()); // verify, dedupe, enqueue, 202
//!     let app = axum::Router::new().nest("/webhooks/acme", receiver.router());
//!     let store = MemoryStore::new(); // in production: SqliteStore or PostgresStore
//!     let worker = Worker::new(queue, Idempotent::new(store), |event: Event| async move {
//!         println!("handling {} once", event.id); // your effect; retried with backoff on Err
//!         Ok::<(), HandlerError>(())
//!     });
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
//!     tokio::spawn(async move { axum::serve(listener, app).await });
//!     worker.run(async { tokio::signal::ctrl_c().await.unwrap_or(()) }).await; // drains in-flight jobs
//!     Ok(())
//! }
//! ```
//!
//! * [`verify`]: Standard Webhooks (`v1` HMAC and `v1a` Ed25519), Stripe,
//!   GitHub and shared-secret headers, over the raw body bytes, in
//!   constant time.
//! * [`Receiver`]: the endpoint, for axum ([`Receiver::router`], feature
//!   `axum`) and actix-web (`Receiver::actix_resource`, feature `actix`),
//!   one behaviour under both; its problems come from idem-http's
//!   catalogue. A forged delivery is 401 and enqueues
//!   nothing, a resend is a 2xx that enqueues nothing twice.
//! * [`queue`]: the [`Queue`](queue::Queue) contract, [`SqliteQueue`](queue::SqliteQueue)
//!   and [`PostgresQueue`](queue::PostgresQueue); every transition of a
//!   claimed job is fenced by its claim's token. A PostgreSQL queue given
//!   the worker's `PostgresStore` ([`with_store`](queue::PostgresQueue::with_store))
//!   claims the events' idem keys in the commit that claims their jobs.
//! * [`Enqueue`]: the part of a queue the receiver needs — a job once per
//!   (source, event id). Every queue is one; idem-broker makes NATS
//!   JetStream, RabbitMQ and Redis Streams one, so a receiver can publish
//!   to a broker instead of a table (its consumer then handles the events).
//! * [`Worker`]: bounded concurrency, heartbeats, graceful shutdown,
//!   retries with full-jitter backoff, `Retry-After`, dead letters.
//! * Handlers that call rate-limited APIs pace them with idem-http's
//!   [`RateLimiter`](idem_http::ratelimit::RateLimiter), a token bucket
//!   per destination.
//! * `conformance` (feature): the kit that proves a queue backend.
#![forbid(unsafe_code)]

mod clock;
mod completer;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod enqueue;
pub mod handler;
mod metrics;
pub mod queue;
pub mod verify;
pub mod worker;

pub use clock::Clock;
pub use enqueue::Enqueue;
pub use handler::{Event, Handler, HandlerError};
pub use worker::{Outcome, Worker, WorkerConfig};
pub mod receiver;
pub use receiver::{Received, Receiver, Rejection};
