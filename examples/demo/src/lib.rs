//! idem's runnable showcase: a payments API whose `POST /payments` is made
//! safe to retry by `idem-tower`, and a retry storm that proves it charges
//! every payment exactly once.
//!
//! The `idem-demo` binary wraps this library (`serve`, `storm`); tests and
//! other programs can run the same storm in-process:
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::MemoryStore;
//! use idem_demo::{storm_in_process, StormConfig};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), idem_demo::StormError> {
//! let mut config = StormConfig::default();
//! config.clients = 4;
//! config.payments = 20;
//! let report = storm_in_process(Arc::new(MemoryStore::new()), &config).await?;
//! println!("{report}");
//! assert!(report.passed(), "a payment was charged twice or not at all");
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod app;
mod chaos;
mod client;
mod ledger;
mod payments;
mod report;
mod server;
mod store;
mod storm;
mod verify;
mod webhooks;
mod webhooks_effects;
mod webhooks_provider;
mod webhooks_worker;

pub use app::{router, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use chaos::{storm_with_chaos, ChaosReport, CHAOS_LEASE};
pub use client::ClientError;
pub use ledger::{Charge, Gateway, Ledger};
pub use payments::{router_in_db, ChargeBook};
pub use report::Report;
pub use server::{RunningServer, DEFAULT_GATEWAY_LATENCY};
pub use store::{StoreKind, StoreSpec, StoreSpecError};
pub use storm::{run_storm, storm_in_process, StormConfig, StormError};
pub use webhooks::{
    run_webhooks, InboxSpec, WebhooksConfig, WebhooksError, WebhooksReport, DEMO_LEASE,
};
pub use webhooks_worker::run_webhooks_worker;
