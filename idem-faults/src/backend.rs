//! The stores under test, described so that a worker process can open the
//! same one: a SQLite file, a Redis key prefix, a PostgreSQL or MariaDB
//! table.

use std::path::PathBuf;
use std::sync::Arc;

use idem_core::{Store, StoreError};
use idem_testing::Server;

/// One store, as every process of a test opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A Redis server and the key prefix that isolates this test.
    Redis {
        /// The server's URL.
        url: String,
        /// The key prefix.
        prefix: String,
    },
    /// A PostgreSQL database and the table that isolates this test.
    Postgres {
        /// The database's URL.
        url: String,
        /// The table.
        table: String,
    },
    /// A MariaDB database and the table that isolates this test.
    MySql {
        /// The database's URL.
        url: String,
        /// The table.
        table: String,
    },
}

impl Backend {
    /// The backend's short name.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "sqlite",
            Backend::Redis { .. } => "redis",
            Backend::Postgres { .. } => "postgres",
            Backend::MySql { .. } => "mysql",
        }
    }

    /// Opens the store (creating the table for PostgreSQL and MariaDB).
    pub async fn open(&self) -> Result<Arc<dyn Store>, StoreError> {
        Ok(match self {
            Backend::Sqlite(path) => Arc::new(idem_sqlite::SqliteStore::open(path).await?),
            Backend::Redis { url, prefix } => Arc::new(
                idem_redis::RedisStore::connect(url.as_str())
                    .await?
                    .with_prefix(prefix.clone()),
            ),
            Backend::Postgres { url, table } => {
                let store = idem_postgres::PostgresStore::connect(url)
                    .await?
                    .with_table(table)?;
                store.migrate().await?;
                Arc::new(store)
            }
            Backend::MySql { url, table } => {
                let store = idem_mysql::MySqlStore::connect(url)
                    .await?
                    .with_table(table)?;
                store.migrate().await?;
                Arc::new(store)
            }
        })
    }

    /// The backend as command-line words, for a worker process.
    pub fn to_args(&self) -> Vec<String> {
        match self {
            Backend::Sqlite(path) => vec!["sqlite".into(), path.display().to_string()],
            Backend::Redis { url, prefix } => vec!["redis".into(), url.clone(), prefix.clone()],
            Backend::Postgres { url, table } => {
                vec!["postgres".into(), url.clone(), table.clone()]
            }
            Backend::MySql { url, table } => vec!["mysql".into(), url.clone(), table.clone()],
        }
    }

    /// The inverse of [`Backend::to_args`].
    pub fn from_args(args: &[String]) -> Option<Backend> {
        match args {
            [kind, path] if kind == "sqlite" => Some(Backend::Sqlite(PathBuf::from(path))),
            [kind, url, prefix] if kind == "redis" => Some(Backend::Redis {
                url: url.clone(),
                prefix: prefix.clone(),
            }),
            [kind, url, table] if kind == "postgres" => Some(Backend::Postgres {
                url: url.clone(),
                table: table.clone(),
            }),
            [kind, url, table] if kind == "mysql" => Some(Backend::MySql {
                url: url.clone(),
                table: table.clone(),
            }),
            _ => None,
        }
    }
}

/// A fresh name for this test's prefix or table.
pub fn unique_name(what: &str) -> String {
    idem_testing::unique_name(&format!("idem_{what}"))
}

/// The Redis URL for tests, or `None` (after printing why) when no server
/// answers. Panics instead when `CI` is set: there a missing server is a
/// failure.
pub fn redis_url() -> Option<String> {
    Server::Redis.require()
}

/// The PostgreSQL URL for tests, or `None` as for [`redis_url`].
pub fn postgres_url() -> Option<String> {
    Server::Postgres.require()
}

/// The MariaDB URL for tests, or `None` as for [`redis_url`].
pub fn mysql_url() -> Option<String> {
    Server::MySql.require()
}
