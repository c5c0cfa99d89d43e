//! An embedded SQLite [`Store`](idem_core::store::Store) for idem: one file, nothing
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
//!
//! # Exactly-once effects: transactional completion
//!
//! When the work's effect is a write to the same database file,
//! [`SqliteStore::execute_in_tx`] records the outcome in the same
//! transaction as the work's rows, so a crash leaves both or neither and a
//! stale owner's rows are undone. The work is a **synchronous closure run
//! on the writer thread** inside a savepoint of the writer's current
//! group-commit transaction; the token-fenced completion runs in the same
//! savepoint. The alternatives cost more: a second connection with its own
//! transaction would wait for the write lock the writer holds, and running
//! an async closure while holding the writer would stall every other
//! caller for as long as the closure awaits. A synchronous closure costs
//! the others only its own run time, and its writes share one commit (one
//! fsync) with the operations that queued before it. The closure cannot
//! end the transaction: SQLite's authorizer refuses `COMMIT`, `ROLLBACK`
//! and releasing the savepoint inside it. [`SqliteStore::settle_in_tx`] is
//! the low-level step for a [`Lease`](idem_core::Lease) from
//! `Idempotent::begin`. [`SqliteStore::execute_in_tx_remembering`] records
//! chosen work errors as remembered failures in the same savepoint, with
//! the rows the work wrote before failing.
//!
//! # Disk space: purging and vacuum
//!
//! An expired record is absent to every method at once; its row stays
//! until [`purge_expired`](idem_core::store::Store::purge_expired) deletes it (run
//! [`spawn_purger`](idem_core::store::spawn_purger), or the same loop yourself).
//! The store never runs `VACUUM` and leaves SQLite's `auto_vacuum` at its
//! default, off: the pages a purge frees go to the file's free list and
//! later inserts reuse them. Under steady churn the file therefore settles
//! at the size of the largest set of records it has held (live records plus
//! those expired but not yet purged) and stays there; it never shrinks by
//! itself. The write-ahead log beside it is checkpointed automatically
//! (SQLite's default, every 1,000 pages) and stays a few MiB.
//!
//! This is on purpose: a vacuum rewrites the whole file under the write
//! lock, stalling every caller for as long as that takes, to give back
//! space the next peak would take again. To shrink the file after a peak
//! that will not return, run `VACUUM` while the application is stopped
//! (it needs free disk about the file's size), or `VACUUM INTO` a new file
//! and swap it in. `dev/idem-bench/notes/2026-12-01-purge-at-scale.md`
//! shows the file size and free pages after a churn.
#![forbid(unsafe_code)]

mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod group;
mod inspect;
mod ops;
#[cfg(feature = "raw-protocol")]
mod raw;
mod schema;
mod steps;
mod store;
mod tx;
mod writer;

pub use group::Settle;
pub use rusqlite;
pub use store::{
    SqliteStore, Synchronous, DEFAULT_BUSY_TIMEOUT, DEFAULT_CACHE_BYTES, DEFAULT_MAX_BATCH,
    PURGE_CHUNK,
};
pub use tx::{SqliteTx, TxFuture};
