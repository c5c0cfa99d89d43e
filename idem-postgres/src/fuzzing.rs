//! Entry points for the fuzz targets in `idem-fuzz`; not a stable API.

use std::time::Duration;

use idem_core::store::{Record, StoreError};

/// Decodes a record from the values of its six columns (`token`,
/// `fingerprint`, `state`, `payload`, and the lease and retention left in
/// microseconds), as the store decodes every row it reads.
pub fn decode_columns(
    token: &[u8],
    fingerprint: &[u8],
    state: i16,
    payload: Vec<u8>,
    lease_left: Option<i64>,
    retain_left: i64,
) -> Result<Record, StoreError> {
    crate::row::columns(token, fingerprint, state, payload, lease_left, retain_left)
}

/// A duration in the whole microseconds the store binds it as.
pub fn micros(duration: Duration) -> i64 {
    crate::row::interval(duration).microseconds
}
