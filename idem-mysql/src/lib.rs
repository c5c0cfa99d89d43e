//! A MariaDB [`Store`](idem_core::store::Store) for idem: one InnoDB table, the
//! database's clock, one statement per operation.
//!
//! ```no_run
//! use idem_core::Idempotent;
//! use idem_mysql::MySqlStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MySqlStore::connect("mysql://app@127.0.0.1/app")
//!     .await?
//!     .with_table("idem_records")?;
//! store.migrate().await?; // creates the table and its index if missing
//!
//! let idem = Idempotent::new(store);
//! let receipt: String = idem
//!     .execute("order-7f3a", &("charge", 1250), || async {
//!         Ok::<_, std::io::Error>("ch_1".to_owned())
//!     })
//!     .await?;
//! # let _ = receipt;
//! # Ok(())
//! # }
//! ```
//!
//! # Servers
//!
//! Supported: **MariaDB 10.5 and later**, the first release with
//! `INSERT … RETURNING`, on InnoDB. Tested: MariaDB 10.11 (every test of
//! this crate and the whole conformance kit run against it).
//!
//! **MySQL (8.0, 8.4, 9.x) is not supported yet.** It has no `RETURNING`,
//! so no single statement can insert a record or hand back the live one; a
//! claim there would be `INSERT … ON DUPLICATE KEY UPDATE` followed by a
//! `SELECT`, which the binary protocol cannot send as one message. Its
//! ways to one round trip (a stored procedure run by `CALL`, or a
//! multi-statement text query with client-side escaping) are not built
//! yet. On MySQL the first claim fails with a config
//! [`StoreError`](idem_core::store::StoreError) that says so, before any work runs.
//!
//! # The table
//!
//! [`migrate`](MySqlStore::migrate) creates one InnoDB table (a crash of the
//! database does not forget recorded outcomes) with an index on
//! `retain_until` for purging:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `idem_records` (
//!     `key` VARBINARY(1024) NOT NULL PRIMARY KEY, -- the encoded idempotency key
//!     token VARBINARY(16) NOT NULL,               -- the owner's 16-byte fencing token
//!     fingerprint VARBINARY(64) NOT NULL,         -- SHA-256 of the request, with its scheme
//!     state TINYINT NOT NULL,                     -- 0 in flight, 1 completed, 2 failed
//!     payload LONGBLOB NOT NULL,                  -- the encoded outcome
//!     lease_until DATETIME(6) NULL,               -- in flight only, UTC
//!     retain_until DATETIME(6) NOT NULL,          -- the row is absent after this, UTC
//!     KEY retain_until_idx (retain_until)
//! ) ENGINE = InnoDB
//! ```
//!
//! The key is binary, not text: a text collation would fold case and
//! ignore trailing spaces, and two distinct keys would share a record.
//! Payloads travel in one packet, so the server's `max_allowed_packet`
//! (16 MiB by default on MariaDB 10.11) bounds a stored outcome.
//!
//! # Time
//!
//! Leases and retention go to the database as whole microseconds; every
//! deadline is `UTC_TIMESTAMP(6) + INTERVAL n MICROSECOND` and every
//! comparison and remaining time is computed against `UTC_TIMESTAMP(6)` in
//! SQL. The application servers' clocks never matter. The server fixes
//! `UTC_TIMESTAMP(6)` at the start of each statement, so the liveness test
//! and the new deadlines within one statement agree; it is UTC so that no
//! session time zone or daylight-saving change moves a deadline. A
//! statement that waits on a row lock keeps its start time, so the
//! deadlines it writes count from when it began: a lease it grants is
//! shorter by that wait, which the heartbeat's margin (it renews every
//! third of the lease) absorbs.
//!
//! # Round trips
//!
//! Each [`Store`](idem_core::store::Store) method is one statement in its own
//! autocommit transaction, run as a prepared statement from sqlx's
//! per-connection cache: a first execution costs two statements (claim,
//! complete), a replay, an in-progress answer or a mismatch one. The claim
//! is one `INSERT … ON DUPLICATE KEY UPDATE … RETURNING`: it inserts the
//! record, replaces an expired one, or returns the live one unchanged. A
//! replay changes no column, and InnoDB writes nothing for an unchanged
//! row. A `reset` (an operator's step) is a `DELETE … RETURNING` of the
//! row only if it is settled; when it deleted nothing, a locking read says
//! whether the key is in flight or absent (a second round trip), and a row
//! that was settled again meanwhile sends the delete once more.
//!
//! # Locks and deadlocks
//!
//! The claim locks one primary-key record: the existing row for a key that
//! is there, or the gap where a new key goes (InnoDB's duplicate check
//! takes that lock at every isolation level, `READ COMMITTED` included).
//! It takes no table lock and never scans a range, and neither do the
//! compare-and-sets (`UPDATE`/`DELETE … WHERE key = ? AND token = ?`), so
//! operations on different keys never wait on each other, and operations
//! on one key queue on its row for the length of one statement.
//!
//! InnoDB can still pick a store statement as a deadlock victim when
//! another transaction on the same table takes wider locks (a range locked
//! `FOR UPDATE` through the retention index, then a wait on the key the
//! claim just inserted). The victim is rolled back whole — being alone in
//! its autocommit transaction, nothing of it took effect — so the store runs
//! it again, up to eight times, and the caller sees the outcome of one
//! serial order as usual; only a statement that loses nine deadlocks in a
//! row surfaces one, as a backend [`StoreError`](idem_core::store::StoreError)
//! (safe to retry). The store's own statements never deadlock with each
//! other in its tests: 32 callers claiming, releasing and completing four
//! shared keys, with the reruns switched off, saw no deadlock; and a
//! constructed deadlock shows the rerun turning it into a plain success.
//!
//! # Purging expired records
//!
//! An expired record is absent to every method at once; its row stays until
//! [`purge_expired`](idem_core::store::Store::purge_expired) deletes it, in batches
//! of at most `limit` rows, oldest first. A batch is read without locks
//! (a consistent read of the retention index), then deleted by primary key
//! with the expiry checked again, in statements of at most 500 keys: a row a
//! claim renewed in between stays, a row another purger took is not
//! counted twice, and no range of the index is locked against claims. Run a
//! loop like this on every app server:
//!
//! ```no_run
//! # use idem_core::store::Store;
//! # use idem_mysql::MySqlStore;
//! # async fn purger(store: MySqlStore) {
//! let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
//! loop {
//!     every.tick().await;
//!     // Small batches keep each statement short; loop while full.
//!     while let Ok(1000) = store.purge_expired(1000).await {}
//! }
//! # }
//! ```
//!
//! ## Memory for a large table
//!
//! Claims and replays stay as fast at millions of records as at thousands
//! while InnoDB's buffer pool holds the table, or at least its primary key.
//! At 10 million records the table is about 3.8 GB; with MariaDB's default
//! 128 MiB pool, replays there took 1.4–1.8× their time on a 10,000-record
//! table, and with `innodb_buffer_pool_size` at 4 GiB 1.0–1.06×
//! (`dev/idem-bench/notes/2026-11-30-scale.md`). Size the pool for the records the
//! retention keeps: about 380 bytes each.
//!
//! # Exactly-once effects: transactional completion
//!
//! When the work's effect is a write to the same MariaDB server,
//! [`execute_in_tx`](MySqlStore::execute_in_tx) runs the work inside a
//! transaction and records its outcome with a token-fenced `UPDATE` **in
//! that transaction**: one commit makes the business rows and the outcome
//! durable together, so a crash leaves both or neither, and a stale owner
//! (its lease taken over) gets `LeaseLost` while its transaction rolls
//! back. The claim still commits on its own first, and the heartbeat renews
//! through a second pool connection.
//! [`execute_in_tx_remembering`](MySqlStore::execute_in_tx_remembering)
//! records chosen work errors as remembered failures in the same
//! transaction. [`complete_in`](MySqlStore::complete_in) and
//! [`fail_in`](MySqlStore::fail_in) are the step for a transaction the
//! caller manages. The policy is idem-core's, shared with the other SQL
//! stores ([`StoreTx`](idem_core::store::StoreTx)).
//!
//! Where this store differs from PostgreSQL's: InnoDB ends a transaction
//! on its own when it picks it as a deadlock victim, and sqlx does not
//! notice, so the fenced update also requires `@@in_transaction = 1`:
//! it never records an outcome in autocommit apart from the business
//! writes (a refusal is a config error that says so). Business tables must
//! be InnoDB; a MyISAM or Aria write commits on its own. Costs: the claim,
//! `BEGIN`, the work's statements, the fenced update and `COMMIT` — the
//! statements the raw protocol needs for the same job (counted by the
//! server in this crate's tests).
//!
//! # Connecting in production
//!
//! Managed MySQL and MariaDB want TLS. The `tls` feature, on by default,
//! gives sqlx rustls on ring and Mozilla's roots; the URL says the rest,
//! with the mysql client's names:
//!
//! ```text
//! mysql://app:PASSWORD@db.internal:3306/app?ssl-mode=VERIFY_IDENTITY&ssl-ca=/etc/idem/ca.pem
//! ```
//!
//! * `ssl-mode=VERIFY_IDENTITY` checks the chain and the host name: use
//!   it. `REQUIRED` encrypts without checking who answers; `VERIFY_CA`
//!   checks the chain.
//! * `ssl-ca=FILE` trusts a private CA; `ssl-cert=FILE` and `ssl-key=FILE`
//!   present a client certificate, for users created `REQUIRE X509`.
//! * A failed handshake fails [`MySqlStore::connect`] before any work can
//!   run, and its error names the cause (`UnknownIssuer`, `not valid for
//!   name`). `tests/tls.rs` starts a MariaDB with
//!   `require_secure_transport` and runs the conformance kit over it.
//! * An expired server certificate is refused by the same rustls check;
//!   the Redis and PostgreSQL TLS tests start servers that present one.
//! * No error or `Debug` shows the password. The `idem` command, the proxy
//!   and the demo read a URL from `--store-file` or `IDEM_STORE`, out of
//!   the process list.
//!
//! # Failures
//!
//! A lost connection (server restart, `KILL`) fails the operation in
//! flight with a backend [`StoreError`](idem_core::store::StoreError); the pool
//! drops the broken connection and opens a new one for later calls. A row
//! that does not decode is a corrupt `StoreError`; a missing table, a bad
//! name or an unsupported server a config one.
//!
//! Each of the store's statements, the wait for a connection included, is
//! bounded by [`with_statement_timeout`](MySqlStore::with_statement_timeout)
//! (10 s by default): a connection that stops answering (half-open, or
//! behind a partition) fails its call with a backend error and is closed,
//! and the pool opens a new one, so the store serves again once the
//! network does. `dev/idem-faults/tests/network.rs` runs a storm through
//! latency, starved bandwidth, resets, half-open connections and a
//! partition.
#![forbid(unsafe_code)]

mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod inspect;
mod row;
mod schema;
mod store;
mod tx;

#[doc(hidden)]
#[cfg(feature = "raw-protocol")]
pub mod raw;

pub use schema::DEFAULT_TABLE;
pub use sqlx;
pub use store::{MySqlStore, DEFAULT_STATEMENT_TIMEOUT};
pub use tx::TxFuture;

/// The backend name in this crate's [`StoreError`](idem_core::store::StoreError)s.
pub(crate) const BACKEND: &str = "mysql";
