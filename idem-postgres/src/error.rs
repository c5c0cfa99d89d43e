//! Driver errors typed as [`StoreError`]s, by the server's error codes.

use idem_core::store::StoreError;

use crate::BACKEND;

/// Types a driver error: data that does not decode is corrupt, a missing
/// table or a bad URL is configuration, everything else (lost connections,
/// timeouts, failed statements) is the backend's.
pub(crate) fn error(error: sqlx::Error) -> StoreError {
    // 42P01 undefined_table, 3F000 invalid_schema_name: the table was never
    // migrated, or the name points elsewhere.
    let config = matches!(
        &error,
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("42P01" | "3F000"))
    );
    idem_sql::store_error(BACKEND, error, config)
}
