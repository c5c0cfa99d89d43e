//! Records as DynamoDB items, and back.
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `pk` | S | the encoded key (the partition key) |
//! | `tk` | B | the owner's 16-byte token |
//! | `fp` | B | the fingerprint, in [`Fingerprint::stored`] form |
//! | `st` | N | the state: 0 in flight, 1 completed, 2 failed |
//! | `pl` | B | the payload, absent when empty or kept in parts |
//! | `ls` | N | the lease deadline, Unix milliseconds (in flight only) |
//! | `rt` | N | the retention deadline, Unix milliseconds |
//! | `ttl` | N | the retention deadline in Unix seconds, rounded up, for DynamoDB's TTL |
//! | `np`, `wid`, `plen` | N, B, N | a payload kept in parts: their count, the write's id, the whole length |
//!
//! A payload over [`INLINE_BYTES`] does not fit one item (DynamoDB's limit
//! is 400 KB): it is written first as `np` part items under
//! `pk = key \u{1} wid \u{1} index`, each with `pt` (B) and the record's
//! `rt` and `ttl`, and the record names them. Parts are never changed, only
//! written under a new `wid` and deleted with the record that names them.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use idem_core::store::{NewRecord, Record, State, StoreError, Token};
use idem_core::Fingerprint;
use serde_json::{json, Map, Value};

use crate::error::corrupt;

/// The largest payload kept in the record's own item: 350 KiB leaves room
/// under DynamoDB's 400 KB item limit for the key and the other attributes.
pub(crate) const INLINE_BYTES: usize = 350 * 1024;

pub(crate) fn s(value: &str) -> Value {
    json!({ "S": value })
}

pub(crate) fn n(value: i64) -> Value {
    json!({ "N": value.to_string() })
}

pub(crate) fn b(bytes: &[u8]) -> Value {
    json!({ "B": STANDARD.encode(bytes) })
}

/// The key of part `index` of the write `wid` of the record under `key`.
/// `\u{1}` appears in no key (keys hold no control characters).
pub(crate) fn part_key(key: &str, wid: &[u8; 16], index: usize) -> String {
    format!("{key}\u{1}{}\u{1}{index}", hex::encode(wid))
}

/// The item that stores `record` under `key`, written at `now_ms`. A
/// payload over [`INLINE_BYTES`] is named by its parts, written first with
/// [`encode_parts`] under the same `wid`.
pub(crate) fn encode(
    key: &str,
    record: &NewRecord<'_>,
    now_ms: i64,
    wid: &[u8; 16],
) -> Map<String, Value> {
    let retention = now_ms.saturating_add(millis(record.retention));
    let mut item = Map::new();
    item.insert("pk".into(), s(key));
    item.insert("tk".into(), b(record.token.as_bytes()));
    item.insert("fp".into(), b(record.fingerprint.stored()));
    item.insert("st".into(), n(i64::from(record.state.as_u8())));
    if let Some(lease) = record.lease {
        item.insert("ls".into(), n(now_ms.saturating_add(millis(lease))));
    }
    item.insert("rt".into(), n(retention));
    item.insert("ttl".into(), n(ttl_secs(retention)));
    if record.payload.len() > INLINE_BYTES {
        item.insert("np".into(), n(part_count(record.payload.len()) as i64));
        item.insert("wid".into(), b(wid));
        item.insert("plen".into(), n(record.payload.len() as i64));
    } else if !record.payload.is_empty() {
        item.insert("pl".into(), b(record.payload));
    }
    item
}

/// How many parts a payload of `len` bytes takes (none when inline).
pub(crate) fn part_count(len: usize) -> usize {
    if len > INLINE_BYTES {
        len.div_ceil(INLINE_BYTES)
    } else {
        0
    }
}

/// The part items of a payload over [`INLINE_BYTES`], kept one minute past
/// the retention their record is written with at `now_ms` (a throttled
/// write is sent again a little later than its parts).
pub(crate) fn encode_parts(
    key: &str,
    record: &NewRecord<'_>,
    now_ms: i64,
    wid: &[u8; 16],
) -> Vec<Map<String, Value>> {
    if record.payload.len() <= INLINE_BYTES {
        return Vec::new();
    }
    let retention = now_ms
        .saturating_add(millis(record.retention))
        .saturating_add(60_000);
    record
        .payload
        .chunks(INLINE_BYTES)
        .enumerate()
        .map(|(index, chunk)| {
            let mut part = Map::new();
            part.insert("pk".into(), s(&part_key(key, wid, index)));
            part.insert("pt".into(), b(chunk));
            part.insert("rt".into(), n(retention));
            part.insert("ttl".into(), n(ttl_secs(retention)));
            part
        })
        .collect()
}

/// A stored item, its payload not yet read when it is kept in parts.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) record: Record,
    /// The deadline after which the record is absent.
    pub(crate) retention_ms: i64,
    /// `(count, write id, whole length)` of a payload kept in parts.
    pub(crate) parts: Option<(usize, [u8; 16], usize)>,
}

impl Stored {
    pub(crate) fn is_live(&self, now_ms: i64) -> bool {
        self.retention_ms > now_ms
    }
}

/// Reads an item back as a record whose times are left at `now_ms`.
pub(crate) fn decode(key: &str, item: &Value, now_ms: i64) -> Result<Stored, StoreError> {
    let token = Token::try_from(&bytes(key, item, "tk")?[..])
        .map_err(|e| corrupt(key, format!("tk: {e}")))?;
    let fingerprint = Fingerprint::try_from(&bytes(key, item, "fp")?[..])
        .map_err(|e| corrupt(key, format!("fp: {e}")))?;
    let code = number(key, item, "st")?;
    let state = u8::try_from(code)
        .ok()
        .and_then(State::from_u8)
        .ok_or_else(|| corrupt(key, format!("st: state code {code} is not 0, 1 or 2")))?;
    let retention_ms = number(key, item, "rt")?;
    let lease_remaining = match (state, item.get("ls")) {
        (State::InFlight, Some(_)) => Some(remaining(number(key, item, "ls")? - now_ms)),
        (State::InFlight, None) => return Err(corrupt(key, "an in-flight item without ls")),
        _ => None,
    };
    let (payload, parts) = match item.get("np") {
        None => (
            match item.get("pl") {
                Some(_) => bytes(key, item, "pl")?,
                None => Vec::new(),
            },
            None,
        ),
        Some(_) => {
            let count = usize::try_from(number(key, item, "np")?)
                .map_err(|_| corrupt(key, "np: a negative part count"))?;
            let wid = <[u8; 16]>::try_from(&bytes(key, item, "wid")?[..])
                .map_err(|_| corrupt(key, "wid: not 16 bytes"))?;
            let len = usize::try_from(number(key, item, "plen")?)
                .map_err(|_| corrupt(key, "plen: a negative length"))?;
            (Vec::new(), Some((count, wid, len)))
        }
    };
    Ok(Stored {
        record: Record {
            token,
            fingerprint,
            state,
            payload,
            lease_remaining,
            retention_remaining: remaining(retention_ms - now_ms),
        },
        retention_ms,
        parts,
    })
}

pub(crate) fn bytes(key: &str, item: &Value, name: &str) -> Result<Vec<u8>, StoreError> {
    let text = item
        .get(name)
        .and_then(|v| v.get("B"))
        .and_then(Value::as_str)
        .ok_or_else(|| corrupt(key, format!("{name}: missing or not binary")))?;
    STANDARD
        .decode(text)
        .map_err(|e| corrupt(key, format!("{name}: {e}")))
}

pub(crate) fn number(key: &str, item: &Value, name: &str) -> Result<i64, StoreError> {
    item.get(name)
        .and_then(|v| v.get("N"))
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| corrupt(key, format!("{name}: missing or not an integer")))
}

fn remaining(ms: i64) -> std::time::Duration {
    std::time::Duration::from_millis(ms.max(0) as u64)
}

fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn ttl_secs(retention_ms: i64) -> i64 {
    retention_ms.saturating_add(999).div_euclid(1000)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn record(payload: &[u8]) -> NewRecord<'_> {
        NewRecord {
            token: Token::random(),
            fingerprint: Fingerprint::from_bytes([7; 32]),
            state: State::InFlight,
            payload,
            lease: Some(Duration::from_secs(2)),
            retention: Duration::from_secs(60),
        }
    }

    #[test]
    fn records_read_back_with_their_time_left() {
        let new = record(b"steps");
        assert!(encode_parts("1:k", &new, 1_000, &[0; 16]).is_empty());
        let item = encode("1:k", &new, 1_000, &[0; 16]);
        let stored = decode("1:k", &Value::Object(item), 1_500).unwrap();
        assert_eq!(stored.record.token, new.token);
        assert_eq!(stored.record.payload, b"steps");
        assert_eq!(
            stored.record.lease_remaining,
            Some(Duration::from_millis(1_500))
        );
        assert_eq!(
            stored.record.retention_remaining,
            Duration::from_millis(59_500)
        );
        assert!(stored.is_live(60_999) && !stored.is_live(61_000));
    }

    #[test]
    fn large_payloads_are_split_into_parts() {
        let payload = vec![3u8; INLINE_BYTES * 2 + 1];
        let new = record(&payload);
        assert_eq!(encode_parts("1:k", &new, 0, &[0; 16]).len(), 3);
        let item = encode("1:k", &new, 0, &[0; 16]);
        let stored = decode("1:k", &Value::Object(item), 0).unwrap();
        assert_eq!(
            stored.parts.map(|(n, _, len)| (n, len)),
            Some((3, payload.len()))
        );
    }

    #[test]
    fn damaged_items_are_corrupt_not_a_panic() {
        let mut item = encode("1:k", &record(b""), 0, &[0; 16]);
        item.insert("st".into(), n(9));
        let error = decode("1:k", &Value::Object(item.clone()), 0).unwrap_err();
        assert_eq!(error.kind(), idem_core::store::StoreErrorKind::Corrupt);
        item.insert("tk".into(), b(&[1; 3]));
        assert!(decode("1:k", &Value::Object(item), 0).is_err());
        assert!(decode("1:k", &json!({}), 0).is_err());
    }
}
