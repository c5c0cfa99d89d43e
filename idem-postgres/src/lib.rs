//! A PostgreSQL [`Store`](idem_core::store::Store) for idem: one table, the
//! database's clock, one statement per operation.
//!
//! ```no_run
//! use idem_core::Idempotent;
//! use idem_postgres::PostgresStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::connect("postgres://app@127.0.0.1/app")
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
//! # The table
//!
//! [`migrate`](PostgresStore::migrate) creates one logged table (a crash of
//! the database does not forget recorded outcomes) and an index on
//! `retain_until` for purging:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS "idem_records" (
//!     key text COLLATE "C" PRIMARY KEY,  -- the encoded idempotency key
//!     token bytea NOT NULL,              -- the owner's 16-byte fencing token
//!     fingerprint bytea NOT NULL,        -- SHA-256 of the request
//!     state smallint NOT NULL,           -- 0 in flight, 1 completed, 2 failed
//!     payload bytea NOT NULL,            -- the encoded outcome
//!     lease_until timestamptz,           -- in flight only
//!     retain_until timestamptz NOT NULL  -- the row is absent after this
//! );
//! CREATE INDEX IF NOT EXISTS "idem_records_retain_idx" ON "idem_records" (retain_until);
//! ```
//!
//! # Time
//!
//! Leases and retention go to the database as intervals; every deadline is
//! `statement_timestamp() + interval` and every comparison and remaining
//! time is computed against `statement_timestamp()` in SQL. The application
//! servers' clocks never matter. `statement_timestamp()` is fixed for the
//! whole statement, so the liveness test and the new deadlines within one
//! statement agree (`clock_timestamp()` moves between the columns of one
//! row), and unlike `now()` it does not stay at the start of an enclosing
//! transaction. A statement that waits on a row lock keeps its start time,
//! so the deadlines it writes count from when it began: a lease it grants
//! is shorter by that wait, which the heartbeat's margin (it renews every
//! third of the lease) absorbs.
//!
//! # Round trips
//!
//! Each [`Store`](idem_core::store::Store) method is one statement in its own
//! implicit transaction, run as a prepared statement from sqlx's
//! per-connection cache: a first execution costs two statements (claim,
//! complete), a replay, an in-progress answer or a mismatch one. The claim
//! inserts the record, replaces an expired one, or returns the live one —
//! also when a concurrent transaction committed that row after the
//! statement's snapshot was taken. A replay writes nothing. A `reset`
//! (an operator's step) is one statement too: a `DELETE` of the key's row
//! only if it is settled, and a read of the row's state for the answer
//! when it deleted nothing.
//!
//! # Purging expired records
//!
//! An expired record is absent to every method at once; its row stays until
//! [`purge_expired`](idem_core::store::Store::purge_expired) deletes it, in batches
//! of at most `limit` rows, oldest first. Run a loop like this on every app
//! server (purgers skip rows another purger holds, so they never wait on
//! each other), or the same `DELETE` from `pg_cron`:
//!
//! ```no_run
//! # use idem_core::store::Store;
//! # use idem_postgres::PostgresStore;
//! # async fn purger(store: PostgresStore) {
//! let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
//! loop {
//!     every.tick().await;
//!     // Small batches keep each transaction short; loop while full.
//!     while let Ok(1000) = store.purge_expired(1000).await {}
//! }
//! # }
//! ```
//!
//! ## Autovacuum on a large table
//!
//! Every record leaves two dead row versions behind: the completion's
//! update (it changes `retain_until`, which is indexed, so it is never a
//! HOT update) and the purge's delete. Autovacuum reclaims them, but by
//! default only once dead rows exceed 20 % of the table
//! (`autovacuum_vacuum_scale_factor = 0.2`): on a table of 10 million
//! records that is 2 million dead rows, about 17 minutes of churn at 1,000
//! first executions a second, and the space they hold is bloat until then.
//! For a table of millions of records, make the trigger a fixed amount of
//! churn instead, for example a few minutes' worth, and let the vacuum run
//! unthrottled (the `insert` settings exist from PostgreSQL 13):
//!
//! ```sql
//! ALTER TABLE idem_records SET (
//!     autovacuum_vacuum_scale_factor = 0,
//!     autovacuum_vacuum_threshold = 200000,
//!     autovacuum_vacuum_insert_scale_factor = 0,
//!     autovacuum_vacuum_insert_threshold = 200000,
//!     autovacuum_analyze_scale_factor = 0.02,
//!     autovacuum_vacuum_cost_delay = 0
//! );
//! ```
//!
//! A vacuum makes the dead rows' space reusable (and gives back empty pages
//! at the file's end), so the table then holds at its steady-state size;
//! indexes keep what they grew before it. Measured over an hour of churn at
//! 10 million records with these settings, autovacuum ran every two
//! minutes and the heap held within 3 % of its size after the bulk load;
//! with no vacuum, 25 minutes of the same churn had grown it 16 %
//! (`dev/idem-bench/notes/2026-12-01-purge-at-scale.md`).
//!
//! A replay is one primary-key lookup; at millions of records it stays
//! about as fast as at thousands while the key's index fits in
//! `shared_buffers` and the kernel's page cache (at 10 million records the
//! table is 2.2 GB and its indexes 0.8 GB).
//!
//! # Exactly-once effects: transactional completion
//!
//! When the work's effect is a write to the same database,
//! [`execute_in_tx`](PostgresStore::execute_in_tx) runs the work inside a
//! transaction and records its outcome with a token-fenced update **in that
//! transaction**: one commit makes the business rows and the outcome
//! durable together, so a crash leaves both or neither, and a stale owner
//! (its lease taken over) gets `LeaseLost` while its transaction rolls back.
//! The claim still commits on its own first, and the heartbeat renews
//! through a second pool connection. [`complete_in`](PostgresStore::complete_in)
//! and [`fail_in`](PostgresStore::fail_in) are the same step for a
//! transaction the caller manages, and
//! [`execute_in_tx_remembering`](PostgresStore::execute_in_tx_remembering)
//! records chosen work errors as remembered failures in the work's
//! transaction. The policy lives in idem-core
//! ([`StoreTx`](idem_core::store::StoreTx)), shared with the other SQL stores. Costs: the claim, `BEGIN`, the work's
//! statements, the fenced update and `COMMIT`: the round trips the raw
//! protocol needs for the same job.
//!
//! # Connecting in production
//!
//! Managed PostgreSQL (RDS, Cloud SQL, Neon, Supabase) wants TLS. The `tls`
//! feature, on by default, gives sqlx rustls on ring and Mozilla's roots;
//! the URL says the rest, with libpq's names:
//!
//! ```text
//! postgres://app:PASSWORD@db.internal:5432/app?sslmode=verify-full&sslrootcert=/etc/idem/ca.pem
//! ```
//!
//! * `sslmode=verify-full` checks the chain and the host name: use it.
//!   `require` encrypts without checking who answers. `verify-ca` should
//!   skip the name; with sqlx 0.8.6 and rustls 0.23.46 it checks it too.
//! * `sslrootcert=FILE` trusts a private CA (RDS's bundle) instead of
//!   Mozilla's roots; `sslcert=FILE` and `sslkey=FILE` present a client
//!   certificate, for `hostssl … clientcert=verify-full`.
//! * A wrong CA, an expired certificate or a wrong name fails
//!   [`PostgresStore::connect`] before any work can run, and the error says
//!   which. `tests/tls.rs` runs the conformance kit on a server with only
//!   `hostssl` lines that require client certificates.
//! * No error or `Debug` shows the password. The `idem` command, the proxy
//!   and the demo read a URL from `--store-file` or `IDEM_STORE`, out of
//!   the process list.
//!
//! # Failures
//!
//! A lost connection (server restart, `pg_terminate_backend`) fails the
//! operation in flight with a backend [`StoreError`](idem_core::store::StoreError);
//! the pool drops the broken connection and opens a new one for later
//! calls. A row that does not decode is a corrupt `StoreError`, a missing
//! table or a bad name a config one.
//!
//! Each of the store's statements, the wait for a connection included, is
//! bounded by [`with_statement_timeout`](PostgresStore::with_statement_timeout)
//! (10 s by default): a connection that stops answering (half-open, or
//! behind a partition) fails its call with a backend error and is closed,
//! and the pool opens a new one, so the store serves again once the
//! network does. `dev/idem-faults/tests/network.rs` runs a storm through
//! latency, starved bandwidth, resets, half-open connections and a
//! partition.
//!
//! # Replication and failover
//!
//! What a failover keeps is what the primary waited for before it answered.
//! With the standby named in `synchronous_standby_names` and
//! `synchronous_commit = on` (the default; `remote_apply` also works), a
//! claim or an outcome commits on the standby before the store returns, so
//! a promoted standby holds every claim whose work ran and every outcome a
//! caller was told: no key runs twice under a live lease and every told
//! outcome replays. With asynchronous replication (no
//! `synchronous_standby_names`) the writes the standby had not received are
//! lost with the primary, their keys run again, and their callers' outcomes
//! do not replay. Measured by `tests/postgres/failover.rs` (see
//! `RELIABILITY.md`): the primary killed with its last writes held back
//! from the standby, about 50 told outcomes lost a storm asynchronously,
//! none synchronously. The cost is one more round trip to the standby per
//! commit (two commits per first execution; a replay commits nothing):
//! first executions 0.72× at one caller and 0.81× at eight on loopback,
//! replays unchanged (`replica-bench`).
//!
//! The store follows the primary through its pool's address (a virtual
//! address, a proxy, or DNS that a failover manager moves): broken
//! connections fail their call with a backend error that says whether the
//! work ran, and later calls open new ones. A statement cancelled while its
//! commit waits for the standby (`pg_cancel_backend`, or a backend ended
//! because its client left, which `client_connection_check_interval` turns
//! on) commits on the primary without it. The store never cancels: a
//! statement past its timeout has its connection closed, and the server
//! keeps waiting for the standby as long as that setting stays at its
//! default, 0. A primary whose standby is gone blocks its commits until one
//! returns, the price of the guarantee: `ANY 1 (a, b)` with two standbys
//! keeps serving while one is down.
#![forbid(unsafe_code)]

mod batch;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod inspect;
mod notify;
mod row;
mod schema;
mod steps;
mod store;
mod tx;

#[doc(hidden)]
#[cfg(feature = "raw-protocol")]
pub mod raw;

pub use schema::DEFAULT_TABLE;
pub use sqlx;
pub use store::{PostgresStore, DEFAULT_STATEMENT_TIMEOUT};
pub use tx::TxFuture;

/// The backend name in this crate's [`StoreError`](idem_core::store::StoreError)s.
pub(crate) const BACKEND: &str = "postgres";
