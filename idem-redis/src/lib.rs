//! A Redis store for idem: one key per record, one round trip per
//! operation (two for a claim that finds a record in flight), deadlines on
//! the server's clock, Redis Cluster safe.
//!
//! ```no_run
//! use idem_core::Idempotent;
//! use idem_redis::RedisStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379")
//!     .await?
//!     .with_prefix("shop:idem:");
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
//! See [`RedisStore`] for the encoding, the scripts' guarantees and
//! [`RedisStore::connect_cluster`] for Redis Cluster.
#![forbid(unsafe_code)]

mod connection;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod inspect;
mod ops;
#[doc(hidden)]
#[cfg(feature = "raw-protocol")]
pub mod raw;
mod reconnect;
mod record;
mod scripts;
mod store;
mod tls;
mod wake;

pub use redis;
pub use store::{RedisStore, DEFAULT_PREFIX};
pub use tls::connection_info;
