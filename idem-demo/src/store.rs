//! Choosing the idempotency store at run time from a URL.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use idem_core::{MemoryStore, Store, StoreError};
use idem_mysql::MySqlStore;
use idem_postgres::PostgresStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;

/// Which store to keep idempotency records in, as given on the command
/// line: `sqlite:PATH`, `redis://…`, `postgres://…`, `mysql://…` or
/// `memory`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreSpec {
    /// An in-process [`MemoryStore`]: records vanish with the process.
    Memory,
    /// A SQLite file, created if missing.
    Sqlite(PathBuf),
    /// A Redis server, by URL.
    Redis(String),
    /// A PostgreSQL database, by URL; its table is created if missing.
    Postgres(String),
    /// A MariaDB database, by URL; its table is created if missing.
    MySql(String),
}

/// A `--store` value that names no store this demo knows.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown store {0:?}: use sqlite:PATH, redis://HOST, postgres://HOST/DB, mysql://HOST/DB or memory"
)]
pub struct StoreSpecError(String);

impl FromStr for StoreSpec {
    type Err = StoreSpecError;

    fn from_str(spec: &str) -> Result<StoreSpec, StoreSpecError> {
        if spec == "memory" || spec == "memory:" {
            return Ok(StoreSpec::Memory);
        }
        if let Some(path) = spec.strip_prefix("sqlite:") {
            // `sqlite://PATH` is the URL form of the same thing.
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(StoreSpecError(spec.to_owned()));
            }
            return Ok(StoreSpec::Sqlite(PathBuf::from(path)));
        }
        if spec.starts_with("redis://") || spec.starts_with("rediss://") {
            return Ok(StoreSpec::Redis(spec.to_owned()));
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            return Ok(StoreSpec::Postgres(spec.to_owned()));
        }
        if spec.starts_with("mysql://") || spec.starts_with("mariadb://") {
            return Ok(StoreSpec::MySql(spec.to_owned()));
        }
        Err(StoreSpecError(spec.to_owned()))
    }
}

impl fmt::Display for StoreSpec {
    /// Shows the store without any password in its URL, so it can be
    /// logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreSpec::Memory => f.write_str("memory"),
            StoreSpec::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreSpec::Redis(url) | StoreSpec::Postgres(url) | StoreSpec::MySql(url) => {
                f.write_str(&redact(url))
            }
        }
    }
}

impl StoreSpec {
    /// The backend's short name: `memory`, `sqlite`, `redis`, `postgres` or
    /// `mysql`.
    pub fn backend(&self) -> &'static str {
        match self {
            StoreSpec::Memory => "memory",
            StoreSpec::Sqlite(_) => "sqlite",
            StoreSpec::Redis(_) => "redis",
            StoreSpec::Postgres(_) => "postgres",
            StoreSpec::MySql(_) => "mysql",
        }
    }

    /// Opens the store, connecting to its server and creating its file or
    /// table where needed.
    pub async fn open(&self) -> Result<Arc<dyn Store>, StoreError> {
        match self {
            StoreSpec::Memory => Ok(Arc::new(MemoryStore::new())),
            StoreSpec::Sqlite(path) => Ok(Arc::new(SqliteStore::open(path).await?)),
            StoreSpec::Redis(url) => Ok(Arc::new(RedisStore::connect(url.as_str()).await?)),
            StoreSpec::Postgres(url) => {
                let store = PostgresStore::connect(url).await?;
                store.migrate().await?;
                Ok(Arc::new(store))
            }
            StoreSpec::MySql(url) => {
                let store = MySqlStore::connect(url).await?;
                store.migrate().await?;
                Ok(Arc::new(store))
            }
        }
    }
}

/// `scheme://user:secret@host` → `scheme://user:***@host`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_specs_parse_by_scheme() {
        let parse = |s: &str| s.parse::<StoreSpec>().unwrap();
        assert_eq!(parse("memory"), StoreSpec::Memory);
        assert_eq!(parse("sqlite:a.db"), StoreSpec::Sqlite("a.db".into()));
        assert_eq!(
            parse("sqlite:///tmp/a.db"),
            StoreSpec::Sqlite("/tmp/a.db".into())
        );
        assert_eq!(
            parse("redis://h:6379"),
            StoreSpec::Redis("redis://h:6379".into())
        );
        assert_eq!(parse("postgresql://h/db").backend(), "postgres");
        assert_eq!(
            parse("mysql://root@h:3306/test"),
            StoreSpec::MySql("mysql://root@h:3306/test".into())
        );
        assert_eq!(parse("mariadb://h/db").backend(), "mysql");
        assert!("mongodb://h/db".parse::<StoreSpec>().is_err());
        assert!("sqlite:".parse::<StoreSpec>().is_err());
    }

    #[test]
    fn passwords_never_show_in_a_displayed_store() {
        let spec: StoreSpec = "postgres://root:hunter2@db:5432/test".parse().unwrap();
        assert_eq!(spec.to_string(), "postgres://root:***@db:5432/test");
        let spec: StoreSpec = "redis://:hunter2@cache/0".parse().unwrap();
        assert_eq!(spec.to_string(), "redis://:***@cache/0");
        let spec: StoreSpec = "redis://cache/0".parse().unwrap();
        assert_eq!(spec.to_string(), "redis://cache/0");
    }
}
