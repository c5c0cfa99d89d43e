//! An embedded SQLite [`Store`](idem_core::Store) for idem: one file, nothing
//! to install, every recorded outcome on disk before it is reported.
//!
//! ```
//! use idem_core::Idempotent;
//! use idem_sqlite::SqliteStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("idem.db");
//! let store = SqliteStore::open(&path).await?;
//! let idem = Idempotent::new(store);
//!
//! let order = serde_json::json!({ "sku": "tea", "quantity": 2 });
//! let charge = || async { Ok::<_, std::io::Error>(String::from("ch_1")) };
//! let first: String = idem.execute("order-7f3a", &order, charge).await?;
//! // A retry replays the recorded outcome; the work does not run again.
//! let retry: String = idem
//!     .execute("order-7f3a", &order, || async { Ok::<_, std::io::Error>(String::from("ch_2")) })
//!     .await?;
//! assert_eq!(first, retry);
//! # Ok(())
//! # }
//! ```
//!
//! See [`SqliteStore`] for how it works: one writer thread, group commit,
//! WAL with full synchronous commits, deadlines on the local clock.
#![forbid(unsafe_code)]

mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod ops;
mod raw;
mod schema;
mod store;
mod writer;

pub use rusqlite;
pub use store::{SqliteStore, Synchronous, DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_BATCH};
