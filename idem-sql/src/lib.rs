//! An internal of the idem SQL stores, exempt from semver.
//!
//! What the stores share, written once: table names checked and
//! quoted ([`TableName`]), durations as whole microseconds ([`micros`]),
//! a row's columns decoded into a [`Record`](idem_core::store::Record)
//! ([`record`]), driver errors typed ([`store_error`]), and transactions
//! begun so that a cancelled caller cannot leave one open ([`begin`]).
//!
//! `idem-postgres`, `idem-mysql` and `idem-inbox`'s PostgreSQL queue use
//! it; a new SQL store should too, so that the rules a name must follow and
//! the meaning of a stored row are the same everywhere.
//!
//! ```
//! use idem_sql::{Dialect, TableName};
//!
//! #[derive(Debug, Clone, PartialEq, Eq)]
//! struct Ansi;
//!
//! impl Dialect for Ansi {
//!     const BACKEND: &'static str = "ansi";
//!     const QUOTE: char = '"';
//!     const QUALIFIER: &'static str = "schema";
//!     const MAX_QUALIFIER: usize = 63;
//!     const MAX_TABLE: usize = 63;
//!     const DEFAULT_TABLE: &'static str = "idem_records";
//! }
//!
//! let name = TableName::<Ansi>::parse("app.Orders")?;
//! assert_eq!(name.quoted(), "\"app\".\"Orders\"");
//! assert!(TableName::<Ansi>::parse("x; drop table y").is_err());
//! # Ok::<(), idem_core::store::StoreError>(())
//! ```
//!
//! # Why a crate of its own
//!
//! The stores are published, so what they share must be published too; it
//! is not policy (that is `idem-core`'s) and it needs `sqlx`'s error type,
//! which `idem-core` must not depend on. It holds no driver: each store
//! keeps its statements, its row reading and its server's error codes.
#![forbid(unsafe_code)]

mod begin;
#[doc(hidden)]
pub mod bounded;
mod error;
mod name;
mod row;

pub use begin::begin;
pub use error::store_error;
pub use name::{identifier, Dialect, TableName};
pub use row::{micros, record, remaining, LONGEST};

/// What the exported macros name, so the crates that call them need not
/// name these themselves.
#[doc(hidden)]
pub mod __private {
    pub use tokio;
}
