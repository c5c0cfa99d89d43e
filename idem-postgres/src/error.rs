//! Between rows and records: durations out, records in, errors typed.

use std::time::Duration;

use idem_core::{Fingerprint, Record, State, StoreError, Token};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::BACKEND;

// Longer durations mean "as long as the database can count" rather than an
// out-of-range timestamp error, as `MemoryStore` does.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A duration as an interval of whole microseconds, rounded up so that a
/// non-zero lease never becomes a zero one.
pub(crate) fn interval(duration: Duration) -> PgInterval {
    let micros = duration.min(LONGEST).as_nanos().div_ceil(1_000);
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(micros).unwrap_or(i64::MAX),
    }
}

/// Decodes the columns `token, fingerprint, state, payload, lease_until_left,
/// retain_until_left` (the last two in microseconds) from `offset` on.
pub(crate) fn record(row: &PgRow, offset: usize) -> Result<Record, StoreError> {
    columns(
        row.try_get(offset).map_err(error)?,
        row.try_get(offset + 1).map_err(error)?,
        row.try_get(offset + 2).map_err(error)?,
        row.try_get(offset + 3).map_err(error)?,
        row.try_get(offset + 4).map_err(error)?,
        row.try_get(offset + 5).map_err(error)?,
    )
}

/// Decodes a record from its columns' values, as [`record`] reads them.
pub(crate) fn columns(
    token: &[u8],
    fingerprint: &[u8],
    code: i16,
    payload: Vec<u8>,
    lease_left: Option<i64>,
    retain_left: i64,
) -> Result<Record, StoreError> {
    let token = Token::try_from(token).map_err(|e| corrupt(e.to_string()))?;
    // 32 bytes are a scheme-1 fingerprint, as every row written before
    // schemes existed holds; later schemes add their number in front.
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
        lease_remaining: (state == State::InFlight).then(|| micros(lease_left.unwrap_or(0))),
        retention_remaining: micros(retain_left),
    })
}

fn micros(left: i64) -> Duration {
    Duration::from_micros(u64::try_from(left).unwrap_or(0))
}

fn corrupt(why: String) -> StoreError {
    StoreError::corrupt(BACKEND, why)
}

/// Types a driver error: data that does not decode is corrupt, a missing
/// table or a bad URL is configuration, everything else (lost connections,
/// timeouts, failed statements) is the backend's.
pub(crate) fn error(error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => StoreError::corrupt(BACKEND, error),
        sqlx::Error::Configuration(_) => StoreError::config(BACKEND, error),
        // 42P01 undefined_table, 3F000 invalid_schema_name: the table was
        // never migrated, or the name points elsewhere.
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("42P01" | "3F000")) => {
            StoreError::config(BACKEND, error)
        }
        _ => StoreError::backend(BACKEND, error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_up_to_whole_microseconds_and_saturate() {
        assert_eq!(interval(Duration::from_millis(250)).microseconds, 250_000);
        assert_eq!(interval(Duration::from_nanos(1)).microseconds, 1);
        assert_eq!(interval(Duration::ZERO).microseconds, 0);
        assert_eq!(
            interval(Duration::MAX).microseconds,
            i64::try_from(LONGEST.as_micros()).unwrap()
        );
    }

    #[test]
    fn negative_remaining_times_are_zero() {
        assert_eq!(micros(-5), Duration::ZERO);
        assert_eq!(micros(1_500), Duration::from_micros(1_500));
    }
}
