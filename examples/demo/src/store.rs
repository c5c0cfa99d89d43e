//! Choosing the idempotency store at run time from a URL.
//!
//! The stores and their URL schemes come from `idem-stores`, the one list
//! of shipped stores (the demo is a binary users run, so it reads a
//! shipped crate, not the test kit): a store added there is a `--store`
//! here with no change to the demo.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use idem_core::store::{Store, StoreError};
pub use idem_stores::StoreKind;
use idem_stores::{StoreUrl, UnknownStore};

/// Which store to keep idempotency records in, as given on the command
/// line: `sqlite:PATH`, `redis://…`, `postgres://…`, `mysql://…`,
/// `memory`, or any other URL `idem-stores` knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSpec(StoreUrl);

/// A `--store` value that names no store this demo knows.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StoreSpecError(UnknownStore);

impl FromStr for StoreSpec {
    type Err = StoreSpecError;

    fn from_str(spec: &str) -> Result<StoreSpec, StoreSpecError> {
        spec.parse().map(StoreSpec).map_err(StoreSpecError)
    }
}

impl fmt::Display for StoreSpec {
    /// Shows the store without any password in its URL, so it can be
    /// logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl StoreSpec {
    /// A SQLite file, created if missing.
    pub fn sqlite(path: impl Into<PathBuf>) -> StoreSpec {
        let path: PathBuf = path.into();
        StoreSpec(StoreUrl::new(StoreKind::Sqlite, path.display().to_string()))
    }

    /// Which store.
    pub fn kind(&self) -> StoreKind {
        self.0.kind()
    }

    /// The backend's short name: `memory`, `sqlite`, `redis`, `postgres`,
    /// `mysql`, ….
    pub fn backend(&self) -> &'static str {
        self.0.kind().name()
    }

    /// The server's URL (with its password), the file's path, or empty
    /// for memory.
    pub fn location(&self) -> &str {
        self.0.location()
    }

    /// The file's path, for a store kept in a file.
    pub fn path(&self) -> Option<&Path> {
        self.0.path()
    }

    /// The store as a `--store` argument for another process (with its
    /// password, unlike `Display`).
    pub fn to_arg(&self) -> String {
        match self.path() {
            Some(path) => format!("{}:{}", self.backend(), path.display()),
            None if self.location().is_empty() => self.backend().to_owned(),
            None => self.location().to_owned(),
        }
    }

    /// Opens the store, connecting to its server and creating its file or
    /// table where needed.
    pub async fn open(&self) -> Result<Arc<dyn Store>, StoreError> {
        self.0.open().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_specs_parse_by_scheme() {
        let parse = |s: &str| s.parse::<StoreSpec>().unwrap();
        assert_eq!(parse("memory").kind(), StoreKind::Memory);
        assert_eq!(parse("sqlite:a.db"), StoreSpec::sqlite("a.db"));
        assert_eq!(parse("sqlite:///tmp/a.db"), StoreSpec::sqlite("/tmp/a.db"));
        assert_eq!(parse("redis://h:6379").location(), "redis://h:6379");
        assert_eq!(parse("postgresql://h/db").backend(), "postgres");
        assert_eq!(parse("mariadb://h/db").backend(), "mysql");
        let unknown = "mongodb://h/db".parse::<StoreSpec>().unwrap_err();
        assert!(unknown.to_string().contains("sqlite:PATH"), "{unknown}");
        assert!("sqlite:".parse::<StoreSpec>().is_err());
    }

    #[test]
    fn passwords_never_show_in_a_displayed_store_but_reach_a_child() {
        let spec: StoreSpec = "postgres://root:hunter2@db:5432/test".parse().unwrap();
        assert_eq!(spec.to_string(), "postgres://root:***@db:5432/test");
        assert_eq!(spec.to_arg(), "postgres://root:hunter2@db:5432/test");
        let spec: StoreSpec = "redis://:hunter2@cache/0".parse().unwrap();
        assert_eq!(spec.to_string(), "redis://:***@cache/0");
        assert_eq!(StoreSpec::sqlite("/x.db").to_arg(), "sqlite:/x.db");
        assert_eq!("memory".parse::<StoreSpec>().unwrap().to_arg(), "memory");
    }
}
