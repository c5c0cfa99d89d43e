//! Between rows and records: durations out as the microseconds the
//! statements bind, records in from the columns they return.

use std::time::Duration;

use idem_core::store::{Record, StoreError};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::error::error;
use crate::BACKEND;

/// A duration in whole microseconds, rounded up so that a non-zero lease
/// never becomes a zero one (see [`idem_sql::micros`]).
pub(crate) fn micros(duration: Duration) -> i64 {
    idem_sql::micros(duration)
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
