//! Shared test support for the idem workspace (not published): where the
//! servers are, skip-or-fail, unique names, cleanup guards and the stores
//! by name.
//!
//! ```
//! use idem_testing::{unique_name, Server};
//!
//! // The URL from IDEM_REDIS_URL, or the local default.
//! assert!(Server::Redis.url().starts_with("redis://"));
//! // Names no other test, fixture or process uses.
//! assert_ne!(unique_name("idem_test"), unique_name("idem_test"));
//! ```
//!
//! # The skip policy
//!
//! A test that needs a server it cannot reach **skips with a printed
//! reason** on a developer's machine and **fails** when the `CI`
//! environment variable is set, so CI never passes by skipping:
//! [`Server::require`] for one test, [`Server::require_for_binary`] for a
//! test binary whose tests all need the server (the conformance kit's
//! macro emits tests that cannot skip one by one).
//!
//! # The stores by name
//!
//! With the `stores` feature, `StoreKind` (from `idem-stores`, the one list
//! of stores, with `TestStore` for what tests add) is what tests, the
//! bench, the demo and the fault tests learn of a store: its name, the
//! server it needs, and how to open a fresh, isolated one.
#![forbid(unsafe_code)]

mod cleanup;
pub mod legacy;
mod names;
pub mod postgres;
pub mod process;
pub mod races;
pub mod relay;
pub mod reshard;
mod server;
mod skip;
mod sql;
pub mod sql_cases;
pub mod sql_races;
mod sql_tx;
#[cfg(feature = "stores")]
mod stores;
pub mod storm;
pub mod tls;
pub mod upstream;
pub mod waiting;

pub use cleanup::Cleanup;
pub use names::unique_name;
pub use server::Server;
pub use skip::{in_ci, skip, skip_binary, CI};
pub use sql::sql_pool;
#[cfg(feature = "stores")]
pub use stores::{Fresh, Isolation, StoreKind, StoreUrl, TestStore, UnknownStore};

/// What the exported macros name, so the crates that call them need not
/// depend on these themselves.
#[doc(hidden)]
pub mod __private {
    pub use idem_core;
    pub use sqlx;
}
