//! Between rows and records: durations out as the intervals the
//! statements bind, records in from the columns they return.

use std::time::Duration;

use idem_core::store::{Record, StoreError};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::error::error;
use crate::BACKEND;

/// A duration as an interval of whole microseconds, rounded up so that a
/// non-zero lease never becomes a zero one (see [`idem_sql::micros`]).
pub(crate) fn interval(duration: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: idem_sql::micros(duration),
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
    idem_sql::record(
        BACKEND,
        token,
        fingerprint,
        code.into(),
        payload,
        lease_left,
        retain_left,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_whole_microseconds_only() {
        let interval = interval(Duration::from_nanos(1_500));
        assert_eq!((interval.months, interval.days), (0, 0));
        assert_eq!(interval.microseconds, 2);
    }
}
