//! The stores under test, described so that a worker process can open the
//! same one: any store of `idem-stores`' list, where it is (a server's URL,
//! a file's path) and the name that isolates this test (a key prefix, a
//! table).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use idem_core::store::{Store, StoreError};
use idem_testing::{Fresh, Server, StoreKind};

/// One store, as every process of a test opens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    kind: StoreKind,
    location: String,
    scope: String,
}

impl Backend {
    /// `kind` at `location` (a server's URL, a file's path), isolated by
    /// `scope` (a key prefix without its `:`, or a table).
    pub fn new(kind: StoreKind, location: impl Into<String>, scope: impl Into<String>) -> Backend {
        Backend {
            kind,
            location: location.into(),
            scope: scope.into(),
        }
    }

    /// A SQLite file.
    pub fn sqlite(path: impl AsRef<Path>) -> Backend {
        Backend::new(StoreKind::Sqlite, path.as_ref().display().to_string(), "")
    }

    /// The store a [`Fresh`] holds, for other processes to open.
    pub fn of_fresh(kind: StoreKind, fresh: &Fresh) -> Backend {
        Backend::new(kind, fresh.location.clone(), fresh.name.clone())
    }

    /// The backend's short name.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Which store.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// The server's URL, or the file's path.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The key prefix (without its `:`) or table that isolates this test.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The file's path, for SQLite.
    pub fn path(&self) -> Option<PathBuf> {
        (self.kind == StoreKind::Sqlite).then(|| PathBuf::from(&self.location))
    }

    /// Opens the store (creating the table of a SQL store).
    pub async fn open(&self) -> Result<Arc<dyn Store>, StoreError> {
        self.kind.open(&self.location, Some(&self.scope)).await
    }

    /// The backend as command-line words, for a worker process.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            self.kind.name().to_owned(),
            self.location.clone(),
            self.scope.clone(),
        ]
    }

    /// The inverse of [`Backend::to_args`].
    pub fn from_args(args: &[String]) -> Option<Backend> {
        match args {
            [kind, location, scope] => Some(Backend::new(
                kind.parse().ok()?,
                location.clone(),
                scope.clone(),
            )),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_survives_the_command_line() {
        for backend in [
            Backend::sqlite("/tmp/x.db"),
            Backend::new(StoreKind::Redis, "redis://h:1", "p"),
            Backend::new(StoreKind::MySql, "mysql://u@h/db", "t"),
        ] {
            assert_eq!(Backend::from_args(&backend.to_args()), Some(backend));
        }
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Backend::from_args(&words(&["mongo", "x", "y"])), None);
        assert_eq!(Backend::from_args(&words(&["redis", "x"])), None);
    }
}
