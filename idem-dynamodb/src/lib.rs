//! A DynamoDB store for idem: one item per record, one conditional write
//! per operation, strongly consistent reads, DynamoDB's TTL for retention.
//!
//! ```no_run
//! use idem_core::Idempotent;
//! use idem_dynamodb::DynamoStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
//! // AWS_SESSION_TOKEN, as Lambda sets them.
//! let store = DynamoStore::connect("dynamodb://idem-records?region=eu-west-1").await?;
//! store.create_table().await?; // once, like the SQL stores' migrate()
//! let idem = Idempotent::new(store);
//!
//! let order = serde_json::json!({ "amount": 1250, "currency": "EUR" });
//! let receipt: String = idem
//!     .execute("order-7f3a", &order, || async {
//!         Ok::<_, std::io::Error>("charge ch_1".to_owned())
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # The table
//!
//! One item per record, its partition key `pk` (a string) the encoded key.
//! [`DynamoStore::create_table`] makes the table on-demand and turns on
//! TTL on `ttl`. A table made by hand (CloudFormation, Terraform, CDK)
//! needs exactly that: partition key `pk` of type `S`, no sort key, TTL
//! on `ttl`.
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `pk` | S | the encoded key |
//! | `tk` | B | the owner's token (16 bytes) |
//! | `fp` | B | the request's fingerprint |
//! | `st` | N | 0 in flight, 1 completed, 2 failed |
//! | `pl` | B | the payload; absent when empty |
//! | `ls` | N | the lease deadline, Unix milliseconds (in flight only) |
//! | `rt` | N | the retention deadline, Unix milliseconds |
//! | `ttl` | N | the retention deadline, Unix seconds, for DynamoDB's TTL |
//!
//! A payload over 350 KiB does not fit DynamoDB's 400 KB item. It is
//! written first as parts, items of their own, and the record names them
//! (`np`, `wid`, `plen`); a replay reads them back. Outcomes streamed in
//! chunks (`idem_core::chunks`) are records of their own already, 64 KiB
//! each, and never need parts.
//!
//! # One conditional write per operation
//!
//! | operation | call | condition |
//! |---|---|---|
//! | claim (`insert`) | `PutItem` | `attribute_not_exists(pk) OR rt <= :now` |
//! | complete, fail, renew (`swap`) | `PutItem` | `rt > :now AND st = 0 AND tk = :tk` |
//! | take over | `PutItem` | the same `AND ls <= :now` |
//! | release (`remove`) | `DeleteItem` | `rt > :now AND st = 0 AND tk = :tk` |
//! | `reset` | `DeleteItem` | `rt > :now AND st <> 0` |
//! | `load` | `GetItem` | `ConsistentRead` |
//!
//! Every conditional write asks for `ReturnValuesOnConditionCheckFailure
//! = ALL_OLD`. A claim that finds a live record gets it in the same reply,
//! so a replay costs one round trip, as for the other stores. A reset
//! learns from the same reply whether it refused an in-flight record or
//! found nothing. Reads are always strongly consistent: an eventually
//! consistent read could miss a claim made a moment ago and run the work
//! twice.
//!
//! # Deadlines and clocks
//!
//! DynamoDB has no clock a condition can read, so `:now` is the store's
//! clock, sent with each call. That clock is this machine's, corrected to
//! DynamoDB's when they disagree too much. Every reply carries the
//! service's time in its `Date` header, in whole seconds. The store
//! estimates its offset from the middle of the call's round trip; while
//! the estimate stays within the allowance (1 s,
//! [`DynamoStore::with_skew_allowance`]) of the offset in use, the offset
//! is kept, so a clock in sync with NTP is never touched. Past it, the
//! store follows DynamoDB's clock and logs a warning.
//!
//! What holds: after its first reply ([`DynamoStore::connect`] makes one),
//! each process's store clock is within 1.5 s plus half a round trip of
//! DynamoDB's, whatever its own clock says. Two processes therefore agree
//! on a deadline within 3 s plus a round trip. A takeover can come that
//! much early, so leases must be longer: the default 60 s lease is, a
//! lease of a few seconds is not safe between skewed machines. Processes
//! whose clocks agree (NTP, as on Lambda and EC2) are exact to their own
//! clocks. This is weaker than the Redis and SQL stores, whose deadlines
//! are on the server's clock to the millisecond.
//!
//! Retention is the `rt` attribute, checked on every read and write:
//! DynamoDB deletes items past `ttl` only within a few days, so an item
//! still there is not a record still live. [`purge_expired`] scans the
//! table; with TTL on, no purger needs to run.
//!
//! [`purge_expired`]: idem_core::store::Store::purge_expired
//!
//! # Failures
//!
//! A throttled call (`ProvisionedThroughputExceededException`,
//! `ThrottlingException`, `RequestLimitExceeded`) did nothing, so it is
//! sent again, up to 4 times with jittered backoff
//! ([`DynamoStore::with_retries`]). Past them it is a `Backend` error, and
//! idem says whether the work had run (`When::BeforeWork` for a claim,
//! `When::AfterWork` for a completion). Any other failure is not retried:
//! a write whose reply was lost may have taken effect.
//!
//! Waiters poll: DynamoDB Streams could wake them, but would need a
//! stream reader per process.
//!
//! # Why no AWS SDK
//!
//! The store needs four calls of DynamoDB's JSON protocol (`PutItem`,
//! `GetItem`, `DeleteItem`, `Scan`) and three to manage its table. It signs them
//! with Signature Version 4 on `hmac` and `sha2` and sends them with
//! `reqwest`, all already in the workspace: no crate is added. Measured on
//! 2026-12-05, cold builds of a scratch crate that depends only on them:
//!
//! | client | crates | not in idem's lockfile | cold build (CPU) | Rust |
//! |---|---|---|---|---|
//! | `aws-sdk-dynamodb` 1.136 + `aws-config` 1.13 | 201 | 37 | 231 s (146 s) | 1.94.1 |
//! | `aws-sigv4` 1.6 + `aws-credential-types` 1.3 on reqwest | 124 | 14 | 204 s (49 s) | 1.94.1 |
//! | this crate's own signing on reqwest | the workspace's | 0 | nothing added | 1.85 |
//!
//! The wall times come from a shared, busy machine; the CPU figures are
//! the steadier ones (`dev/idem-bench/notes/2026-12-05-dynamodb-client.md`).
//! The official crates need Rust 1.94.1, past the workspace's 1.85. The
//! signing is pinned to the official `aws-sigv4`'s output by a test.
//! Credentials come from the environment or [`Credentials::new`]; profile
//! files, SSO and instance metadata are not read (use the SDK's
//! `aws-config` to resolve them and pass the result).
//!
//! # The emulator the tests use
//!
//! The conformance kit runs against moto in server mode (`dev/moto/start`).
//! That proves the store's conditions, encoding and clock, not DynamoDB's
//! own concurrency. moto differs from DynamoDB: it runs conditional
//! writes one at a time; it never throttles; its reads are always
//! consistent, so a store that asked for eventual consistency would pass
//! there and fail on DynamoDB (this one never asks); it enforces no
//! capacity and deletes nothing by TTL.
//!
//! # Moving from Powertools
//!
//! Powertools' DynamoDB layer names its items differently (partition key
//! `id`, `status`, `expiration`, `data`, `validation`), so idem gets a new
//! table; one table holding both would mix unrelated items. Powertools
//! derives its key from the payload (`event_key_jmespath`); pass the same
//! field as idem's key to keep deduplicating the same events. A key in
//! flight or completed in Powertools' table is not seen by idem: a retry
//! across the cutover runs again, unless the handler looks the key up in
//! the old table for one expiry window (an hour by default). The guide's
//! DynamoDB chapter has the steps.
#![forbid(unsafe_code)]

mod client;
mod error;
mod item;
mod purge;
mod sigv4;
mod store;

pub use error::DynamoError;
pub use reqwest;
pub use sigv4::Credentials;
pub use store::DynamoStore;

/// The backend's name in errors and metrics.
const BACKEND: &str = "dynamodb";
