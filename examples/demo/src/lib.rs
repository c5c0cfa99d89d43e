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
//!
//! # The commands
//!
//! * `idem-demo serve` serves the payments API on 127.0.0.1:3000 over a
//!   SQLite file (`--store sqlite:idem-demo.db`, the default);
//!   `--store redis://127.0.0.1:6379`,
//!   `--store postgres://root@127.0.0.1:5432/test` or
//!   `--store mysql://root@127.0.0.1:3306/test` (MariaDB) switches the
//!   backend. Over SQLite, PostgreSQL or MariaDB each charge is written in
//!   the same transaction as its idempotency record and `GET /payments`
//!   reads the table, so a restart keeps the ledger; over Redis the
//!   simulated gateway dedupes on a key derived from the payment's.
//! * `idem-demo storm --url http://127.0.0.1:3000` fires a retry storm at a
//!   running server and exits non-zero on any payment charged twice or not
//!   at all; without `--url` it storms a server of its own. Some first
//!   attempts hang up mid-charge, and their keys stay held until the
//!   server's lease lapses: start a server you storm with a short one
//!   (`serve --lease-ms 2000`), since the default 60 s outlasts a client's
//!   30 s of retries (`--give-up-after-secs`).
//!   `storm --chaos 10` runs that server as a child process, kills it with
//!   SIGKILL ten times during the storm, restarts it, and checks the
//!   persisted ledger: no payment charged twice, none missing, every 201 a
//!   client saw matching its row.
//! * `idem-demo webhooks --chaos 5` runs the webhook inbox end to end — a
//!   provider resending and forging, flaky handlers retried with backoff,
//!   poison events dead-lettered, the worker killed with SIGKILL five
//!   times — prints a table and exits 1 on a repeated or lost effect
//!   (`--store postgres://…` for PostgreSQL).
//!
//! Logs are plain text, without colour codes, when stderr is not a
//! terminal.
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

pub use app::{router, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use chaos::{storm_with_chaos, ChaosReport, CHAOS_LEASE};
pub use client::ClientError;
pub use ledger::{Charge, Gateway, Ledger};
pub use payments::{router_in_db, ChargeBook};
pub use report::Report;
pub use server::{RunningServer, DEFAULT_GATEWAY_LATENCY};
pub use store::{StoreKind, StoreSpec, StoreSpecError};
pub use storm::{run_storm, storm_in_process, StormConfig, StormError};
pub use webhooks::worker::run_webhooks_worker;
pub use webhooks::{
    run_webhooks, InboxSpec, WebhooksConfig, WebhooksError, WebhooksReport, DEMO_LEASE,
};
