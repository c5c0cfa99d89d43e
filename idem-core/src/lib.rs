//! Make any side effect safe to retry.
//! Work runs once per idempotency key, and every retry gets its recorded outcome back.
//!
//! ```
//! use idem_core::{Error, Idempotent, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let idem = Idempotent::new(MemoryStore::new()); // lease 60 s, retention 24 h
//! let order = serde_json::json!({"amount": 1250, "currency": "EUR"});
//!
//! let charge = || async { Ok::<_, String>("ch_1".to_owned()) };
//! let first: Result<String, Error<String>> = idem.execute("order-7f3a", &order, charge).await;
//! // A retry with the same key and body replays the outcome; the work does not run.
//! let retry: Result<String, Error<String>> = idem
//!     .execute("order-7f3a", &order, || async { Ok("ch_2".to_owned()) })
//!     .await;
//! assert_eq!(first.unwrap(), retry.unwrap());
//!
//! // The same key with another request is refused.
//! let other = serde_json::json!({"amount": 9999, "currency": "EUR"});
//! let refused: Result<String, Error<String>> =
//!     idem.execute("order-7f3a", &other, charge).await;
//! assert!(matches!(refused, Err(Error::Mismatch)));
//! # }
//! ```
//!
//! # The lifecycle of a key
//!
//! A [`Key`] has three parts:
//!
//! * a namespace;
//! * a scope: the tenant or principal, `""` when there is none;
//! * the client key: 1–255 visible ASCII characters.
//!
//! A [`Fingerprint`] is a SHA-256 of what the request means.
//! For JSON bodies it is taken over a canonical form, so field order never matters.
//! Every fingerprint carries the number of its *scheme*: how it was computed.
//! Stores keep the scheme with the record.
//! A caller that changes how it fingerprints requests gives the new way a new number.
//! It sends the old fingerprint along ([`Fingerprint::also_matching`]).
//! Records made the old way then keep replaying (see [Schemes](Fingerprint#schemes)).
//!
//! ```text
//!             claim                    complete(token)
//!  Absent ───────────▶ InFlight ─────────────────────────▶ Completed(outcome)
//!    ▲                 │  │  │ fail(token)                         │
//!    │  release(token) │  │  └────────────────────────────▶ Failed(outcome)
//!    └─────────────────┘  │ lease lapses, same fingerprint           │
//!                         └──▶ taken over: new token          retention lapses ─▶ Absent
//! ```
//!
//! On every call, [`Idempotent::execute`] claims the key in one store round trip.
//! If the key was absent, the work runs.
//! Meanwhile a heartbeat renews the lease every third of its length.
//! Then the outcome is recorded, in a second round trip.
//! If a record was there, one decision says what happens.
//! It is made in this crate only, in this order:
//!
//! 1. a different fingerprint is [`Error::Mismatch`], even while the first
//!    request is still running;
//! 2. a live lease is [`Error::InProgress`] (or a wait, with
//!    [`Idempotent::with_wait`]);
//! 3. a lapsed lease is taken over with a compare-and-set on the old token:
//!    of several recoverers exactly one wins and runs the work;
//! 4. a recorded outcome is replayed.
//!
//! Every owner transition (complete, fail, release, renew) is a compare-and-set on the owner's random token.
//! So an owner whose lease lapsed and was taken over gets [`Error::LeaseLost`].
//! It can never overwrite, delete or extend the newer owner's record.
//! Deadlines are kept on the store's clock, never the caller's.
//!
//! What happens to an outcome:
//!
//! * `Ok` outcomes are recorded and replayed.
//! * `Err` releases the key, so a retry runs again.
//!   [`Idempotent::execute_remembering`] can choose to record it instead.
//! * A panic or a dropped future leaves the key claimed until the lease lapses.
//!   The side effect may have happened.
//! * A store failure says whether the work had run ([`When`]).
//!
//! Frameworks use the lower level underneath.
//! [`Idempotent::begin`] returns [`Begin::Run`] with a [`Lease`] to complete, fail or release.
//! Or it returns [`Begin::Replay`] with the recorded bytes.
//!
//! # Exactly-once effects
//!
//! A lease makes the *work* run once per lease.
//! Callers want the *effect* once, even when a process dies between doing something and recording it.
//! Three mechanisms cover three kinds of effect.
//!
//! **The effect lands in the same SQL database as the records** (PostgreSQL, MariaDB, SQLite).
//! Use *transactional completion*.
//!
//! * The store's `execute_in_tx` runs the work in a transaction.
//! * It records the outcome with a token-fenced update **in that transaction**.
//! * One commit makes the business rows and the outcome durable together.
//! * A crash can do nothing: both land or neither does.
//! * A stale owner's completion matches no row.
//!   Its transaction rolls back, and it gets [`Error::LeaseLost`].
//!
//! **The effect is a call to a remote API that dedupes** on its own idempotency key (a payment gateway, an email API).
//! Use *derived keys*: [`Lease::derive_key`] or [`Key::derive`].
//!
//! * The derived key is the same for every retry and for every owner that takes the key over.
//! * A re-run after a crash sends the same key.
//!   The remote API answers with the first call's result.
//!
//! **Anything else** (an SMTP send, a webhook to a system without keys) has the lease alone.
//!
//! * The effect happens at most once per lease.
//! * A crash after the effect and before the record lets one retry repeat it, once the lease lapses.
//!
//! The SQL stores share one policy ([`StoreTx`](store::StoreTx)) and one shape:
//!
//! * `execute_in_tx(&idem, key, &body, |tx| Box::pin(async move { … }))`;
//! * for a transaction the caller manages: `store.begin()`, then `complete_in(&mut tx, lease, payload)` or `fail_in`;
//!   the [`Uncommitted`](store::Uncommitted) guard they return ends it.
//!
//! How each store runs the transaction:
//!
//! * On PostgreSQL and MariaDB, the work gets the transaction's connection.
//!   The heartbeat renews the lease through another pool connection.
//! * On SQLite, the store's one writer thread serves the transaction (`idem_sqlite::SqliteTx`).
//!   Its other writes wait, so nothing can take the key over and no heartbeat runs.
//! * SQLite's synchronous closure form, `execute_in_batch`, runs inside the writer's group commit.
//!   It shares one commit with the operations queued around it.
//!
//! Each store also has `execute_in_tx_remembering`.
//! It records chosen work errors as remembered failures in the same transaction.
//! An operation made of several effects picks a mechanism per step ([`steps`]).
//!
//! # Waiting instead of 409
//!
//! A caller that finds its key in progress can wait for the outcome.
//! It then gets no [`Error::InProgress`] (HTTP 409).
//!
//! * In code: [`Idempotent::with_wait`].
//! * Over HTTP: `Prefer: wait=N` (RFC 7240), answered with `Preference-Applied: wait`.
//!   The HTTP layer's `with_max_wait` caps it, at 10 s by default.
//!
//! The store wakes the waiter the moment the outcome is recorded:
//!
//! * in process, for [`MemoryStore`] and SQLite;
//! * by `LISTEN`/`NOTIFY` on PostgreSQL, once turned on with `with_notifications(true)`;
//! * by pub/sub on Redis, published by the completion script.
//!
//! PostgreSQL's notifications are off by default.
//! A notifying commit takes a database-wide lock.
//! At 32 callers, that cost first executions more than half their throughput.
//!
//! The waiter still reads the record every [`FALLBACK_POLL`](store::FALLBACK_POLL), in case a wake-up is lost.
//! MariaDB waiters poll, from 5 ms doubling to 250 ms.
//! So does a waiter on a store written before wake-ups existed.
//! Such a store keeps compiling: [`Store::wakeups`](store::Store::wakeups) defaults to `None`.
//! If the owner crashes, a waiter whose deadline allows takes the key over once the lease lapses.
//! Figures: `BENCHMARKS.md`, "Wake-ups".
//!
//! # Operating idem
//!
//! **Metrics and tracing.** [`observe`] tables every metric and span.
//! Every metric is labelled `store` and `namespace`, never by key.
//! Install the exporter you use (Prometheus, StatsD, …) and they appear.
//! Other crates add their own:
//!
//! * idem-http: `idem_http_responses_total`;
//! * idem-inbox: its `idem_inbox_*` metrics;
//! * idem-broker: `idem_broker_deliveries_total`.
//!
//! Worth an alert:
//!
//! * `idem_lease_lost_total`: work that ran longer than its lease and lost
//!   it;
//! * `idem_store_errors_total{work="after"}`: work that ran but whose
//!   outcome may not be recorded;
//! * a steady `idem_in_progress_total` on one namespace: a stuck key.
//!
//! Keys appear in spans and logs only as a hash of the stored key, 16 hex digits ([`KeyInTraces`](observe::KeyInTraces)).
//! So logs carry no tenant data.
//! `idem inspect` prints the same hash, to go from a log line to the record.
//!
//! **Resetting a key.** Some recorded outcomes must not replay any more.
//! A remembered failure whose cause is fixed is one; an outcome a bug recorded is another.
//! Delete it with [`Idempotent::reset`] or `idem reset KEY`; the next call runs the work again.
//!
//! * Only settled records are deleted, in one atomic step of the store.
//! * A key in flight is refused ([`Reset::InFlight`](store::Reset::InFlight)).
//!   It stays the owner's to release (`idem release --token`).
//! * Each reset writes an audit line, with the target `idem::audit`.
//!   The line holds the store, namespace, hashed key and outcome, and who and why when given.
//! * Each reset counts `idem_resets_total{outcome}`.
//! * A near cache of settled records in another process does not hear of a reset.
//!   It may replay the old outcome until its entry's cap lapses (60 s by default).
//!
//! **Purging.** Redis expires records itself.
//! SQLite, PostgreSQL and MariaDB keep an expired record until it is purged; every call sees it as absent.
//! Run a purger in each app server (they share the work), or `idem purge` from cron:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use idem_core::{Idempotent, MemoryStore};
//! use idem_core::observe::KeyInTraces;
//! use idem_core::store::{Store, spawn_purger};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
//! let purger = spawn_purger(Arc::clone(&store), Duration::from_secs(300)); // counts idem_purged_total
//! let idem = Idempotent::from_arc(store)
//!     .with_namespace("payments")
//!     .with_key_in_traces(KeyInTraces::Hash); // the default
//! # let _ = idem;
//! purger.abort(); // or let it run for the life of the process
//! # }
//! ```
//!
//! # Implementing a store
//!
//! A store implements [`Store`](store::Store): seven primitives, each atomic on one key.
//! The trait's `# Contract` gives the rules.
//! [`MemoryStore`] is the reference.
//! Here is a whole store on the standard library's clock.
//! Prove yours with the `idem-conformance` kit.
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::Mutex;
//! use std::time::{Duration, Instant};
//!
//! use async_trait::async_trait;
//! use idem_core::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token};
//!
//! #[derive(Debug, Default)]
//! struct MapStore(Mutex<HashMap<String, (Record, Instant)>>);
//!
//! impl MapStore {
//!     /// The live record under `key` as of `now`, with times remaining.
//!     fn live(map: &HashMap<String, (Record, Instant)>, key: &str, now: Instant) -> Option<Record> {
//!         let (record, written) = map.get(key)?;
//!         let age = now - *written;
//!         let retention = record.retention_remaining.checked_sub(age).filter(|d| !d.is_zero())?;
//!         Some(Record {
//!             lease_remaining: record.lease_remaining.map(|l| l.saturating_sub(age)),
//!             retention_remaining: retention,
//!             ..record.clone()
//!         })
//!     }
//!
//!     fn write(map: &mut HashMap<String, (Record, Instant)>, key: &str, new: &NewRecord<'_>, now: Instant) {
//!         let record = Record {
//!             token: new.token,
//!             fingerprint: new.fingerprint,
//!             state: new.state,
//!             payload: new.payload.to_vec(),
//!             lease_remaining: new.lease,
//!             retention_remaining: new.retention,
//!         };
//!         map.insert(key.to_owned(), (record, now));
//!     }
//!
//!     fn replace(&self, key: &str, expected: Token, new: &NewRecord<'_>, need_lapsed: bool) -> bool {
//!         let now = Instant::now();
//!         let mut map = self.0.lock().unwrap();
//!         match Self::live(&map, key, now) {
//!             Some(r) if r.state == State::InFlight && r.token == expected
//!                 && (!need_lapsed || r.lease_lapsed()) => {
//!                 Self::write(&mut map, key, new, now);
//!                 true
//!             }
//!             _ => false,
//!         }
//!     }
//! }
//!
//! #[async_trait]
//! impl Store for MapStore {
//!     async fn insert(&self, key: &str, new: &NewRecord<'_>) -> Result<Insert, StoreError> {
//!         let now = Instant::now();
//!         let mut map = self.0.lock().unwrap();
//!         if let Some(found) = Self::live(&map, key, now) {
//!             return Ok(Insert::Found(found));
//!         }
//!         Self::write(&mut map, key, new, now);
//!         Ok(Insert::Inserted)
//!     }
//!     async fn swap(&self, key: &str, expected: Token, new: &NewRecord<'_>) -> Result<bool, StoreError> {
//!         Ok(self.replace(key, expected, new, false))
//!     }
//!     async fn take_over(&self, key: &str, expected: Token, new: &NewRecord<'_>) -> Result<bool, StoreError> {
//!         Ok(self.replace(key, expected, new, true))
//!     }
//!     async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
//!         let mut map = self.0.lock().unwrap();
//!         match Self::live(&map, key, Instant::now()) {
//!             Some(r) if r.state == State::InFlight && r.token == expected => {
//!                 map.remove(key);
//!                 Ok(true)
//!             }
//!             _ => Ok(false),
//!         }
//!     }
//!     async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
//!         Ok(Self::live(&self.0.lock().unwrap(), key, Instant::now()))
//!     }
//!     async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
//!         let mut map = self.0.lock().unwrap();
//!         match Self::live(&map, key, Instant::now()) {
//!             None => Ok(Reset::Absent),
//!             Some(r) if r.state == State::InFlight => Ok(Reset::InFlight),
//!             Some(r) => {
//!                 map.remove(key);
//!                 Ok(Reset::Deleted(r.state))
//!             }
//!         }
//!     }
//!     async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
//!         let now = Instant::now();
//!         let mut map = self.0.lock().unwrap();
//!         let dead: Vec<String> = map.keys()
//!             .filter(|k| Self::live(&map, k, now).is_none())
//!             .take(limit).cloned().collect();
//!         dead.iter().for_each(|k| { map.remove(k); });
//!         Ok(dead.len())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let idem = idem_core::Idempotent::new(MapStore::default());
//! let n: u32 = idem.execute("k", "body", || async { Ok::<_, ()>(7) }).await.unwrap();
//! let again: u32 = idem.execute("k", "body", || async { Ok::<_, ()>(8) }).await.unwrap();
//! assert_eq!((n, again), (7, 7));
//! # let _ = Duration::ZERO;
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod backoff;
mod canonical;
pub mod chunks;
mod effects;
mod error;
pub mod fingerprint;
/// Entry points for the fuzz targets in `idem-fuzz`; not a stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::canonical::canonical_forms;
}
mod idempotent;
pub mod inspect;
mod key;
mod lease;
mod machine;
mod memory;
pub mod observe;
mod reset;
pub mod steps;
pub mod store;

pub use effects::BeginJson;
pub use error::{Error, StepsError, When};
pub use fingerprint::digest::Fingerprint;
pub use idempotent::{Idempotent, DEFAULT_LEASE, DEFAULT_RETENTION};
pub use key::{Key, KeyError, KeyPart};
pub use lease::{Begin, HeldLease, Lease, Replay, RunOutput};
pub use memory::MemoryStore;
pub use steps::durable::Durable;
pub use steps::step::Steps;
