//! Make any side effect safe to retry.
//! Work runs once per idempotency key, and every retry gets its recorded outcome back.
//!
//! This is the front door.
//! [`idem-core`](idem_core)'s API is at the root.
//! Each store and adapter is behind a feature of the same name.
//! The package is `idempotency`; the library is `idem`.
//!
//! ```toml
//! idempotency = { version = "0.1", features = ["redis", "tower"] } # imported as `idem`
//! ```
//!
//! ```
//! use idem::{Error, Idempotent};
//! use idem::sqlite::SqliteStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("idem.db");
//! let idem = Idempotent::new(SqliteStore::open(&path).await?); // created if absent
//! let order = serde_json::json!({"amount": 1250, "currency": "EUR"});
//! let charge = || async { Ok::<_, String>("ch_1".to_owned()) };
//!
//! let first: Result<String, Error<String>> = idem.execute("order-7f3a", &order, charge).await;
//! let retry: Result<String, Error<String>> = idem.execute("order-7f3a", &order, charge).await;
//! assert_eq!(first?, retry?); // the retry is replayed; the work ran once
//! # Ok(())
//! # }
//! ```
//!
//! | feature | module | what it adds |
//! |---|---|---|
//! | `sqlite` (default) | `idem::sqlite` | the embedded SQLite store |
//! | `redis` | `idem::redis` | the Redis and Redis Cluster store |
//! | `postgres` | `idem::postgres` | the PostgreSQL store |
//! | `mysql` | `idem::mysql` | the MariaDB and MySQL store |
//! | `dynamodb` | `idem::dynamodb` | the DynamoDB store |
//! | `stores` | `idem::stores` | every store by name and URL |
//! | `http` | `idem::http` | the Idempotency-Key protocol without a framework |
//! | `tower` | `idem::tower` | middleware for tower, axum and hyper |
//! | `actix` | `idem::actix` | middleware for actix-web |
//! | `tonic` | `idem::tonic` | gRPC: unary calls once per key for tonic servers, safe retries for clients |
//! | `client` | `idem::client` | the retrying reqwest client |
//! | `inbox`, `inbox-postgres`, `inbox-actix` | `idem::inbox` | the webhook inbox and its queues |
//! | `nats`, `amqp`, `redis-streams`, `kafka` | `idem::broker` | idempotent broker consumers |
//! | `conformance` | `idem::conformance` | the kit that proves a store of your own |
//! | `mcp` | `idem::mcp` | MCP tool calls an agent can retry, with an approval gate |
//! | `proxy` | `idem::proxy` | the reverse proxy, as a library |
//!
//! Each module is the crate of the same name: `idem::redis` is `idem-redis`.
//! Depending on those crates directly works as well.
//! The guide (`docs/` in the repository) has a chapter per capability.
#![forbid(unsafe_code)]

pub use idem_core::*;

#[cfg(feature = "actix")]
#[doc(inline)]
pub use idem_actix as actix;
#[cfg(any(
    feature = "nats",
    feature = "amqp",
    feature = "redis-streams",
    feature = "kafka"
))]
#[doc(inline)]
pub use idem_broker as broker;
#[cfg(feature = "client")]
#[doc(inline)]
pub use idem_client as client;
#[cfg(feature = "conformance")]
#[doc(inline)]
pub use idem_conformance as conformance;
#[cfg(feature = "dynamodb")]
#[doc(inline)]
pub use idem_dynamodb as dynamodb;
#[cfg(feature = "http")]
#[doc(inline)]
pub use idem_http as http;
#[cfg(feature = "inbox")]
#[doc(inline)]
pub use idem_inbox as inbox;
#[cfg(feature = "mcp")]
#[doc(inline)]
pub use idem_mcp as mcp;
#[cfg(feature = "mysql")]
#[doc(inline)]
pub use idem_mysql as mysql;
#[cfg(feature = "postgres")]
#[doc(inline)]
pub use idem_postgres as postgres;
#[cfg(feature = "proxy")]
#[doc(inline)]
pub use idem_proxy as proxy;
#[cfg(feature = "redis")]
#[doc(inline)]
pub use idem_redis as redis;
#[cfg(feature = "sqlite")]
#[doc(inline)]
pub use idem_sqlite as sqlite;
#[cfg(feature = "stores")]
#[doc(inline)]
pub use idem_stores as stores;
#[cfg(feature = "tonic")]
#[doc(inline)]
pub use idem_tonic as tonic;
#[cfg(feature = "tower")]
#[doc(inline)]
pub use idem_tower as tower;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's chapters (`docs/src`), their Rust blocks compiled and run as
/// doctests: `mdbook build docs` shows them, `cargo test --doc` checks them.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/src/introduction.md")]
    mod introduction {}
    #[doc = include_str!("../docs/src/stores.md")]
    mod stores {}
    #[doc = include_str!("../docs/src/dynamodb.md")]
    mod dynamodb {}
    #[doc = include_str!("../docs/src/tls.md")]
    mod tls {}
    #[doc = include_str!("../docs/src/http.md")]
    mod http {}
    #[doc = include_str!("../docs/src/languages.md")]
    mod languages {}
    #[doc = include_str!("../docs/src/proxy.md")]
    mod proxy {}
    #[doc = include_str!("../docs/src/grpc.md")]
    mod grpc {}
    #[doc = include_str!("../docs/src/client.md")]
    mod client {}
    #[doc = include_str!("../docs/src/transactions.md")]
    mod transactions {}
    #[doc = include_str!("../docs/src/derived-keys.md")]
    mod derived_keys {}
    #[doc = include_str!("../docs/src/steps.md")]
    mod steps {}
    #[doc = include_str!("../docs/src/waiting.md")]
    mod waiting {}
    #[doc = include_str!("../docs/src/inbox.md")]
    mod inbox {}
    #[doc = include_str!("../docs/src/brokers.md")]
    mod brokers {}
    #[doc = include_str!("../docs/src/mcp.md")]
    mod mcp {}
    #[doc = include_str!("../docs/src/observability.md")]
    mod observability {}
    #[doc = include_str!("../docs/src/cli.md")]
    mod cli {}
}
