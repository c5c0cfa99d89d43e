//! Entry points for the fuzz targets in `idem-fuzz`; not a stable API.

use idem_core::store::{NewRecord, Record, StoreError};

/// Encodes a record as the server keeps it once a script wrote it at
/// `now_ms` on the server's clock.
pub fn encode(record: &NewRecord<'_>, now_ms: u64) -> Vec<u8> {
    crate::record::Encoded::new(record).stored_at(now_ms)
}

/// Decodes a value read at `now_ms` on the server's clock with its key's
/// `PTTL`, as the store decodes every value it reads.
pub fn decode(value: Vec<u8>, now_ms: i64, pttl: i64) -> Result<Record, StoreError> {
    crate::record::decode(b"fuzz", value, crate::record::Clock { now_ms, pttl })
}
