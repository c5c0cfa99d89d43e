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
//! When the work's effect is a write to the same database file, the
//! outcome is recorded in the same transaction as the work's rows, so a
//! crash leaves both or neither and a stale owner's rows are undone. The
//! shape is the PostgreSQL and MariaDB stores': [`SqliteStore::begin`]
//! opens a [`SqliteTx`], [`SqliteStore::complete_in`] and
//! [`SqliteStore::fail_in`] record inside it and return the
//! [`Uncommitted`](idem_core::store::Uncommitted) guard (a rollback or a
//! drop gives the key back), and [`SqliteStore::execute_in_tx`] /
//! [`SqliteStore::execute_in_tx_remembering`] take the same async closure
//! over idem-core's one driver. Code moving between the three stores
//! changes the store type and its statements, nothing else
//! (`examples/transfer` runs on all three).
//!
//! Two differences rusqlite's synchronous, single-writer design makes:
//!
//! * Statements are closures, `tx.call(|conn| conn.execute(…))`, run on
//!   the writer thread inside a savepoint of its transaction; SQLite's
//!   authorizer refuses `COMMIT`, `ROLLBACK` and releasing that savepoint
//!   inside them.
//! * While a `SqliteTx` is open, the writer serves only it: every other
//!   write of the store waits (a SQLite file has one writer at a time
//!   whatever the connection). A second caller of the same key is
//!   answered once the transaction ends, not `InProgress` meanwhile, and no
//!   heartbeat runs, since nothing can take the key over. Keep such a
//!   transaction short and await no other operation of the store in it.
//!
//! Where throughput matters more than the shared shape,
//! [`SqliteStore::execute_in_batch`] runs a **synchronous closure** inside
//! the writer's current group-commit transaction: it costs the other
//! callers only its own run time, and its writes share one commit (one
//! fsync) with the operations queued before it.
//! [`SqliteStore::settle_in_tx`] is its low-level step for a
//! [`Lease`](idem_core::Lease) from `Idempotent::begin`, and
//! [`SqliteStore::execute_in_batch_remembering`] records chosen work
//! errors as remembered failures in the same savepoint.
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
//!
//! When the disk fills, SQLite refuses the write (`SQLITE_FULL`) and rolls
//! it back: every call of the refused commit fails with a backend
//! [`StoreError`](idem_core::store::StoreError) whose `When` says whether
//! its work ran, the file stays whole, and once space is freed the same
//! store writes again, without reopening. Writes that fit in space the
//! write-ahead log already holds still succeed while the disk is full.
//! `tests/sqlite/disk_full.rs` fills a small `tmpfs` mid-storm and checks
//! all of it, `PRAGMA integrity_check` included.
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
