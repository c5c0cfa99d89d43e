//! Driver errors typed the same way by every SQL store.

use idem_core::store::StoreError;

/// Types a driver error for `backend`: data that does not decode is
/// corrupt; a bad URL or option, or an error the server's own codes mark as
/// configuration (`server_config`: a missing table, an unknown schema or
/// database), is configuration; everything else (lost connections,
/// timeouts, failed statements) is the backend's. The source is kept.
pub fn store_error(backend: &'static str, error: sqlx::Error, server_config: bool) -> StoreError {
    match &error {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => StoreError::corrupt(backend, error),
        sqlx::Error::Configuration(_) => StoreError::config(backend, error),
        _ if server_config => StoreError::config(backend, error),
        _ => StoreError::backend(backend, error),
    }
}

#[cfg(test)]
mod tests {
    use idem_core::store::StoreErrorKind;

    use super::*;

    #[test]
    fn each_driver_error_has_its_kind() {
        let kind = |error, config| store_error("t", error, config).kind();
        assert_eq!(
            kind(sqlx::Error::ColumnNotFound("x".into()), false),
            StoreErrorKind::Corrupt
        );
        assert_eq!(
            kind(sqlx::Error::Configuration("bad".into()), false),
            StoreErrorKind::Config
        );
        assert_eq!(
            kind(sqlx::Error::PoolTimedOut, true),
            StoreErrorKind::Config
        );
        assert_eq!(
            kind(sqlx::Error::PoolTimedOut, false),
            StoreErrorKind::Backend
        );
    }
}
