//! Every store idem ships, by name and by URL: the one list that tools
//! choosing a store at run time read (the demo's `--store`, the fault
//! tests' worker processes, the test kit's `StoreKind`, the `idem`
//! command).
//!
//! ```no_run
//! use idem_stores::StoreUrl;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let url: StoreUrl = "postgres://app@db.internal/app".parse()?;
//! // Connects, and creates the table if missing.
//! let store = url.open().await?;
//! let idem = idem_core::Idempotent::from_arc(store);
//! # let _ = idem;
//! # Ok(())
//! # }
//! ```
//!
//! | URL | store | isolated by |
//! |---|---|---|
//! | `memory` | `idem_core::MemoryStore` | the process |
//! | `sqlite:PATH` or `sqlite://PATH` | `idem_sqlite::SqliteStore` | the file |
//! | `redis://…`, `rediss://…` | `idem_redis::RedisStore` | a key prefix |
//! | `postgres://…`, `postgresql://…` | `idem_postgres::PostgresStore` | a table (migrated) |
//! | `mysql://…`, `mariadb://…` | `idem_mysql::MySqlStore` | a table (migrated) |
//! | `dynamodb://TABLE?region=…&endpoint=…` (feature `dynamodb`) | `idem_dynamodb::DynamoStore` | a table (created when missing) |
//!
//! # Connecting in production
//!
//! Each server store takes TLS options in its URL, on by default through
//! the `tls` feature (rustls on ring, Mozilla's roots):
//! `rediss://…?cacert=FILE&cert=FILE&key=FILE`,
//! `postgres://…?sslmode=verify-full&sslrootcert=FILE`,
//! `mysql://…?ssl-mode=VERIFY_IDENTITY&ssl-ca=FILE`. Each store crate's
//! docs say more. [`StoreUrl`] shows a URL with `***` for its password;
//! [`given_url`] reads a URL from a flag, a file or `IDEM_STORE`, so that a
//! password need not appear in a process list.
//!
//! # Why a crate of its own
//!
//! The list has to live where both shipped binaries and the tests can
//! read it. `idem-testing` cannot hold it: it is not published, and a
//! shipped tool must not depend on test support. `idem-core` cannot: the
//! stores depend on it. So it is this small published crate, which knows
//! each store's URL schemes and how to open it, and nothing of tests;
//! `idem-testing` adds servers, skip-or-fail and cleanup on top of it.
//!
//! # Adding a store
//!
//! A variant of [`StoreKind`], its arms in `name`, `schemes`,
//! `isolation` and `open` (the compiler lists them), the crate in this
//! crate's dependencies. Tests, the bench's store list, the demo and the
//! fault tests then know it.
#![forbid(unsafe_code)]

mod given;
mod kind;
mod on_use;
mod url;

pub use given::{given_url, GivenUrlError, STORE_ENV};
pub use kind::{Isolation, StoreKind, UnknownStore};
pub use on_use::{OpenOnUse, Opener};
pub use url::StoreUrl;
