//! Driver errors typed as [`StoreError`]s, by the server's error numbers,
//! and the one error number the store retries on (a deadlock).

use idem_core::store::StoreError;
use sqlx::mysql::MySqlDatabaseError;

use crate::BACKEND;

/// The server's error number, if `error` is one the server sent.
fn number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|db| db.number()),
        _ => None,
    }
}

/// Whether the server rolled the statement back to break a deadlock
/// (ER_LOCK_DEADLOCK, 1213). Nothing of the statement took effect, and in
/// autocommit mode nothing of its transaction either, so it is safe to run
/// again.
pub(crate) fn is_deadlock(error: &sqlx::Error) -> bool {
    number(error) == Some(1213)
}

/// Types a driver error: data that does not decode is corrupt; a missing
/// table, an unknown database, a bad URL or a server without `INSERT …
/// RETURNING` is configuration; everything else (lost connections,
/// timeouts, failed statements) is the backend's.
pub(crate) fn error(error: sqlx::Error) -> StoreError {
    match number(&error) {
        // 1064 ER_PARSE_ERROR: the statements are fixed and valid on
        // MariaDB 10.5+, so a parse error means a server without
        // `INSERT … RETURNING` (MySQL, older MariaDB).
        Some(1064) => StoreError::config(BACKEND, UnsupportedServer { source: error }),
        // 1146 ER_NO_SUCH_TABLE, 1049 ER_BAD_DB_ERROR: the table was never
        // migrated, or the name points elsewhere.
        code => idem_sql::store_error(BACKEND, error, matches!(code, Some(1146 | 1049))),
    }
}

/// The server does not understand the store's statements.
#[derive(Debug)]
struct UnsupportedServer {
    source: sqlx::Error,
}

impl std::fmt::Display for UnsupportedServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the server refused a statement of idem-mysql as a syntax error; \
             idem-mysql needs MariaDB 10.5 or later (`INSERT … RETURNING`)",
        )
    }
}

impl std::error::Error for UnsupportedServer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
