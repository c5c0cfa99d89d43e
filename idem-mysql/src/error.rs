//! Between rows and records: durations out, records in, errors typed.

use std::time::Duration;

use idem_core::{Fingerprint, Record, State, StoreError, Token};
use sqlx::mysql::{MySqlDatabaseError, MySqlRow};
use sqlx::Row;

use crate::BACKEND;

// Longer durations mean "as long as the database can count" rather than an
// out-of-range date error, as `MemoryStore` does. `DATETIME` ends in the
// year 9999, far beyond now plus a century.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A duration in whole microseconds, rounded up so that a non-zero lease
/// never becomes a zero one.
pub(crate) fn micros(duration: Duration) -> i64 {
    let micros = duration.min(LONGEST).as_nanos().div_ceil(1_000);
    i64::try_from(micros).unwrap_or(i64::MAX)
}

/// Decodes the columns `token, fingerprint, state, payload, lease_left,
/// retain_left` (the last two in microseconds).
pub(crate) fn record(row: &MySqlRow) -> Result<Record, StoreError> {
    let token: &[u8] = row.try_get(0).map_err(error)?;
    let fingerprint: &[u8] = row.try_get(1).map_err(error)?;
    let code: i8 = row.try_get(2).map_err(error)?;
    let payload: Vec<u8> = row.try_get(3).map_err(error)?;
    let lease_left: Option<i64> = row.try_get(4).map_err(error)?;
    let retain_left: i64 = row.try_get(5).map_err(error)?;
    columns(token, fingerprint, code, payload, lease_left, retain_left)
}

/// Decodes a record from its columns' values, as read from a row.
pub(crate) fn columns(
    token: &[u8],
    fingerprint: &[u8],
    code: i8,
    payload: Vec<u8>,
    lease_left: Option<i64>,
    retain_left: i64,
) -> Result<Record, StoreError> {
    let token = Token::try_from(token).map_err(|e| corrupt(e.to_string()))?;
    // 32 bytes are a scheme-1 fingerprint; later schemes add their number
    // in front (see `Fingerprint::stored`).
    let fingerprint = Fingerprint::try_from(fingerprint).map_err(|e| corrupt(e.to_string()))?;
    let state = u8::try_from(code)
        .ok()
        .and_then(State::from_u8)
        .ok_or_else(|| corrupt(format!("state {code} is not 0, 1 or 2")))?;
    Ok(Record {
        token,
        fingerprint,
        state,
        payload,
        // An in-flight row without a lease deadline counts as lapsed, so its
        // key can be taken over instead of staying blocked until retention.
        lease_remaining: (state == State::InFlight).then(|| left(lease_left.unwrap_or(0))),
        retention_remaining: left(retain_left),
    })
}

fn left(micros: i64) -> Duration {
    Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}

fn corrupt(why: String) -> StoreError {
    StoreError::corrupt(BACKEND, why)
}

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
    match &error {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => StoreError::corrupt(BACKEND, error),
        sqlx::Error::Configuration(_) => StoreError::config(BACKEND, error),
        // 1146 ER_NO_SUCH_TABLE, 1049 ER_BAD_DB_ERROR: the table was never
        // migrated, or the name points elsewhere.
        _ if matches!(number(&error), Some(1146 | 1049)) => StoreError::config(BACKEND, error),
        // 1064 ER_PARSE_ERROR: the statements are fixed and valid on
        // MariaDB 10.5+, so a parse error means a server without
        // `INSERT … RETURNING` (MySQL, older MariaDB).
        _ if number(&error) == Some(1064) => {
            StoreError::config(BACKEND, UnsupportedServer { source: error })
        }
        _ => StoreError::backend(BACKEND, error),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_microseconds_and_saturate() {
        assert_eq!(micros(Duration::from_millis(250)), 250_000);
        assert_eq!(micros(Duration::from_nanos(1)), 1);
        assert_eq!(micros(Duration::ZERO), 0);
        assert_eq!(
            micros(Duration::MAX),
            i64::try_from(LONGEST.as_micros()).unwrap()
        );
    }

    #[test]
    fn negative_remaining_times_are_zero() {
        assert_eq!(left(-5), Duration::ZERO);
        assert_eq!(left(1_500), Duration::from_micros(1_500));
    }
}
