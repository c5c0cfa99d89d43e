//! Failures inside the store and how they become [`StoreError`]s.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{StoreError, StoreErrorKind};
use rusqlite::ErrorCode;

/// The backend name every [`StoreError`] of this crate carries.
pub(crate) const BACKEND: &str = "sqlite";

/// A failure on the writer thread. Cloneable (the rusqlite error is shared)
/// because one failed `BEGIN` or `COMMIT` is every batched caller's answer.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// Another connection held the lock for the whole busy timeout.
    Locked {
        waited: Duration,
        source: Arc<rusqlite::Error>,
    },
    /// The file cannot be opened or is not a SQLite database.
    Unusable {
        path: String,
        source: Arc<rusqlite::Error>,
    },
    /// The file holds a table of the store's name that the store did not
    /// create.
    ForeignSchema { table: &'static str, found: String },
    /// SQLite refused a setting the store needs.
    Setting {
        what: String,
        source: Option<Arc<rusqlite::Error>>,
    },
    /// A row that is not a valid record.
    BadRow(String),
    /// The writer thread could not be started.
    Spawn(Arc<std::io::Error>),
    /// The writer thread is gone.
    WriterGone,
    /// Any other SQLite failure, shown as SQLite words it.
    Sqlite(Arc<rusqlite::Error>),
}

impl Failure {
    /// Classifies a SQLite error. `waited` is the busy timeout in force, for
    /// the message of a lock that never came free.
    pub(crate) fn from_sqlite(error: rusqlite::Error, waited: Duration) -> Failure {
        match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Failure::Locked {
                waited,
                source: Arc::new(error),
            },
            _ => Failure::Sqlite(Arc::new(error)),
        }
    }

    /// Classifies an error met while opening `path`: a file SQLite cannot
    /// open or read as a database is the caller's configuration, not a
    /// passing backend failure.
    pub(crate) fn opening(path: &str, error: rusqlite::Error, waited: Duration) -> Failure {
        match error.sqlite_error_code() {
            Some(
                ErrorCode::NotADatabase
                | ErrorCode::CannotOpen
                | ErrorCode::PermissionDenied
                | ErrorCode::ReadOnly,
            ) => Failure::Unusable {
                path: path.to_owned(),
                source: Arc::new(error),
            },
            _ => Failure::from_sqlite(error, waited),
        }
    }

    fn kind(&self) -> StoreErrorKind {
        match self {
            Failure::Unusable { .. } | Failure::ForeignSchema { .. } | Failure::Setting { .. } => {
                StoreErrorKind::Config
            }
            Failure::BadRow(_) => StoreErrorKind::Corrupt,
            Failure::Sqlite(error)
                if error.sqlite_error_code() == Some(ErrorCode::DatabaseCorrupt) =>
            {
                StoreErrorKind::Corrupt
            }
            Failure::Locked { .. }
            | Failure::Spawn(_)
            | Failure::WriterGone
            | Failure::Sqlite(_) => StoreErrorKind::Backend,
        }
    }

    pub(crate) fn into_store_error(self) -> StoreError {
        StoreError::new(BACKEND, self.kind(), self)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Locked { waited, .. } => write!(
                f,
                "the database file stayed locked by another connection for the whole \
                 busy timeout ({waited:?}); nothing was changed, try again"
            ),
            Failure::Unusable { path, source } => match source.sqlite_error_code() {
                Some(ErrorCode::NotADatabase) => write!(f, "{path} is not a SQLite database"),
                _ => write!(f, "cannot open {path} as a read-write SQLite database"),
            },
            Failure::ForeignSchema { table, found } => write!(
                f,
                "the database holds a table `{table}` that idem-sqlite did not create \
                 ({found}); point the store at another file"
            ),
            Failure::Setting { what, .. } => write!(f, "SQLite refused a setting: {what}"),
            Failure::BadRow(what) => f.write_str(what),
            Failure::Spawn(_) => f.write_str("the store's writer thread could not be started"),
            Failure::WriterGone => f.write_str("the store's writer thread has stopped"),
            Failure::Sqlite(source) => fmt::Display::fmt(source, f),
        }
    }
}

impl StdError for Failure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Failure::Locked { source, .. } | Failure::Unusable { source, .. } => Some(&**source),
            Failure::Setting { source, .. } => source.as_deref().map(|e| e as _),
            Failure::Spawn(source) => Some(&**source),
            // Shown in SQLite's own words above, so its cause is next in line.
            Failure::Sqlite(source) => source.source(),
            Failure::ForeignSchema { .. } | Failure::BadRow(_) | Failure::WriterGone => None,
        }
    }
}
