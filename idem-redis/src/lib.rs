//! A Redis store for idem: one key per record, one Lua script and one
//! round trip per operation, deadlines on the server's clock, no record a
//! maxmemory policy evicts silently, Redis Cluster safe.
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
//! # Which maxmemory policies are safe
//!
//! | `maxmemory-policy` | records | the store |
//! |---|---|---|
//! | `noeviction` (Redis's default) | never evicted | serves; a full server refuses writes, each error says whether the work ran |
//! | `volatile-lru`, `volatile-lfu`, `volatile-random`, `volatile-ttl` | never evicted: they take only keys with an expiry, and records carry none | serves; once nothing with an expiry is left, as `noeviction` |
//! | `allkeys-lru`, `allkeys-lfu`, `allkeys-random` | evicted like any key: a retry runs its work again | refuses new claims with a `Config` error, unless [`RedisStore::with_record_eviction_allowed`] |
//!
//! Records keep their deadlines in their values, so lapsed ones stay until
//! a purge deletes them: run [`spawn_purger`](idem_core::store::spawn_purger)
//! or `idem purge`.
//!
//! # Connecting in production
//!
//! Managed Redis (ElastiCache with in-transit encryption, Upstash, Redis
//! Cloud) is reached over TLS with an ACL user. The `tls` feature, on by
//! default, gives redis-rs rustls on ring and Mozilla's roots. Pass the URL
//! through [`connection_info`], which reads redis-cli's file options:
//!
//! ```text
//! rediss://app:PASSWORD@cache.internal:6380/0?cacert=/etc/idem/ca.pem&cert=/etc/idem/app.pem&key=/etc/idem/app.key
//! ```
//!
//! * `rediss://` verifies the chain and the host name; `cacert=FILE`
//!   trusts a private CA instead of Mozilla's roots.
//! * `cert=FILE` and `key=FILE` present a client certificate, for servers
//!   with `tls-auth-clients yes`.
//! * `user:password@` logs in as an ACL user. It needs, on the keys under
//!   its prefix, `EVALSHA`, `SCRIPT LOAD`, `SET`, `PTTL`, `SCAN`, `INFO`,
//!   `PUBLISH` and `SUBSCRIBE`, and `WAIT` with replica acks.
//! * `#insecure` skips every certificate check. It is for tests only, and
//!   taken only from the URL.
//! * A wrong CA, an expired certificate or a wrong name fails
//!   [`RedisStore::connect`] before any work can run, and the error says
//!   which (`tests/tls.rs` runs the conformance kit over mutual TLS).
//! * A cluster client goes on to the nodes the cluster names, and a
//!   Sentinel client to the master the Sentinels name, so their
//!   certificates are given apart from the URLs:
//!   [`RedisStore::connect_cluster_with_tls`] and
//!   [`RedisStore::connect_sentinel_with_tls`], with
//!   [`tls_certificates`] reading a URL's files. The servers' certificates
//!   must hold the names they announce (`cluster-announce-hostname` with
//!   `cluster-preferred-endpoint-type hostname`, `sentinel
//!   announce-hostnames yes`), or their IP addresses. `tests/tls_cluster.rs`
//!   runs the conformance kit on a TLS cluster of three masters, and a
//!   store through a Sentinel over TLS.
//! * No error, log line or `Debug` of the store shows the password. The
//!   `idem` command, the proxy and the demo read a URL from
//!   `--store-file` or `IDEM_STORE`, out of the process list.
//!
//! See [`RedisStore`] for the encoding, the scripts' guarantees and
//! [`RedisStore::connect_cluster`] for Redis Cluster.
#![forbid(unsafe_code)]

mod connection;
mod error;
mod eviction;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod inspect;
mod ops;
mod purge;
#[doc(hidden)]
#[cfg(feature = "raw-protocol")]
pub mod raw;
mod reconnect;
mod record;
mod scripts;
mod store;
mod tls;
mod wake;

pub use eviction::evicts_records;
pub use redis;
pub use store::{RedisStore, DEFAULT_PREFIX};
pub use tls::connection_info;
#[cfg(feature = "tls")]
pub use tls::tls_certificates;
