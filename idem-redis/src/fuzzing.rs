//! Entry points for the fuzz targets in `idem-fuzz`; not a stable API.

use idem_core::store::{NewRecord, Record, StoreError};

/// Encodes a record as the store writes it: the value, and the key's
/// expiry in milliseconds.
pub fn encode(record: &NewRecord<'_>) -> (Vec<u8>, u64) {
    let encoded = crate::record::Encoded::new(record);
    let mut args = redis::ToRedisArgs::to_redis_args(&encoded);
    (args.swap_remove(0), encoded.retention_ms)
}

/// Decodes a value read with its key's `PTTL`, as the store decodes every
/// value it reads.
pub fn decode(value: Vec<u8>, pttl: i64) -> Result<Record, StoreError> {
    crate::record::decode(b"fuzz", value, pttl)
}
