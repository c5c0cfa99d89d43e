//! The record encoding: one compact, versioned binary string per key.
//!
//! | bytes | what |
//! |---|---|
//! | 1 | layout version: `1`, or `2` for a fingerprint of a scheme after 1 |
//! | 1 | state: `0` in flight, `1` completed, `2` failed |
//! | 16 | the owner's token |
//! | 32 (v1) or 33 (v2) | the request's fingerprint, in [`Fingerprint::stored`] form: v2 puts its scheme byte before the digest |
//! | 8 | in flight only: the lease deadline, as milliseconds before the key's expiry, big-endian |
//! | rest | the payload |
//!
//! A record whose fingerprint is scheme 1 is written in layout 1, byte for
//! byte as before fingerprints had schemes, so records written by earlier
//! builds replay and earlier builds still read what this one writes; only
//! a later scheme needs layout 2.
//!
//! Both deadlines live on the server's clock. Retention is the key's own
//! expiry, set by the server from a duration (`PX`); the lease deadline is
//! that expiry minus the stored offset (retention − lease), so the lease
//! left is `PTTL − offset` and a lapsed lease is `PTTL <= offset`, read on
//! the server by the same command or script that acts on it. No client
//! clock is involved anywhere, and no deadline needs the server's `TIME`
//! in a script, which keeps the claim a plain `SET … NX GET`.
//!
//! Completed and failed records carry no lease, which keeps a record with a
//! 100-byte outcome within 48 bytes of the bare outcome in Redis's memory
//! (the allocator's size classes put 58 extra bytes at 80). The scripts in
//! `lua/` read the same layout; the two change together, with a new
//! version.

use std::io::Write;
use std::time::Duration;

use idem_core::store::{NewRecord, Record, State, StoreError, Token};
use idem_core::Fingerprint;

use crate::error::{CorruptRecord, Problem};
use redis::{RedisWrite, ToRedisArgs};

pub(crate) const BACKEND: &str = "redis";

/// The layout of a record with a scheme-1 fingerprint (every record
/// written before fingerprints had schemes).
pub(crate) const VERSION: u8 = 1;

/// The layout of a record with a fingerprint of a later scheme.
pub(crate) const VERSION_SCHEMED: u8 = 2;

/// The token's bytes in a value: the same in both layouts.
pub(crate) const TOKEN: std::ops::Range<usize> = 2..18;

/// Version, state, token and a scheme-1 fingerprint: layout 1's head.
pub(crate) const HEAD: usize = TOKEN.end + 32;

/// Layout 2's head: the fingerprint has its scheme byte in front.
pub(crate) const HEAD_SCHEMED: usize = TOKEN.end + 33;

/// The in-flight lease deadline, after the head.
pub(crate) const LEASE_OFFSET: usize = 8;

/// The head length of a layout version, `None` for a version this build
/// does not read.
pub(crate) const fn head_len(version: u8) -> Option<usize> {
    match version {
        VERSION => Some(HEAD),
        VERSION_SCHEMED => Some(HEAD_SCHEMED),
        _ => None,
    }
}

/// A record as written: its value (one argument, assembled in the
/// command's buffer) and its retention in whole milliseconds.
#[derive(Debug)]
pub(crate) struct Encoded<'a> {
    head: [u8; HEAD_SCHEMED],
    head_len: usize,
    lease_offset: Option<u64>,
    payload: &'a [u8],
    /// The key's expiry, for `PX`: never zero, which Redis refuses.
    pub(crate) retention_ms: u64,
}

impl<'a> Encoded<'a> {
    pub(crate) fn new(record: &NewRecord<'a>) -> Encoded<'a> {
        let fingerprint = record.fingerprint.stored();
        let mut head = [0; HEAD_SCHEMED];
        let head_len = TOKEN.end + fingerprint.len();
        head[0] = if head_len == HEAD {
            VERSION
        } else {
            VERSION_SCHEMED
        };
        head[1] = record.state.as_u8();
        head[TOKEN].copy_from_slice(record.token.as_bytes());
        head[TOKEN.end..head_len].copy_from_slice(fingerprint);
        let retention_ms = millis(record.retention).max(1);
        // In flight without a lease is a lease that has already lapsed; a
        // lease longer than the retention ends with the record.
        let lease_offset = (record.state == State::InFlight).then(|| {
            let lease_ms = record.lease.map_or(0, millis);
            retention_ms - lease_ms.min(retention_ms)
        });
        Encoded {
            head,
            head_len,
            lease_offset,
            payload: record.payload,
            retention_ms,
        }
    }
}

impl Encoded<'_> {
    /// The value's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.head_len + self.lease_offset.map_or(0, |_| LEASE_OFFSET) + self.payload.len()
    }
}

impl ToRedisArgs for Encoded<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        let offset = self.lease_offset.map(u64::to_be_bytes);
        // Writing into the command's own buffer cannot fail.
        let _ = arg
            .write_all(&self.head[..self.head_len])
            .and_then(|()| arg.write_all(offset.as_ref().map_or(&[][..], |o| &o[..])))
            .and_then(|()| arg.write_all(self.payload));
    }
}

// Durations are clamped to a century, well within what `PX` accepts.
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// Whole milliseconds, rounded up so that no deadline comes early.
pub(crate) fn millis(duration: Duration) -> u64 {
    let ms = duration.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(MAX_MS).min(MAX_MS)
}

/// Decodes a record from its value and its key's `PTTL`, read together on
/// the server (a settled record found by a bare claim is decoded with a
/// `PTTL` of 0: its retention reads as the least above zero).
pub(crate) fn decode(key: &[u8], value: Vec<u8>, pttl: i64) -> Result<Record, StoreError> {
    let corrupt = |problem| StoreError::corrupt(BACKEND, CorruptRecord::new(key, problem));
    if value.len() < HEAD {
        return Err(corrupt(Problem::Truncated {
            len: value.len(),
            need: HEAD,
        }));
    }
    let head = head_len(value[0]).ok_or_else(|| corrupt(Problem::Version(value[0])))?;
    if value.len() < head {
        return Err(corrupt(Problem::Truncated {
            len: value.len(),
            need: head,
        }));
    }
    let state = State::from_u8(value[1]).ok_or_else(|| corrupt(Problem::State(value[1])))?;
    let token = Token::try_from(&value[TOKEN]).map_err(|e| corrupt(Problem::Parse(e)))?;
    let fingerprint =
        Fingerprint::try_from(&value[TOKEN.end..head]).map_err(|e| corrupt(Problem::Parse(e)))?;
    let (lease_remaining, payload_start) = match state {
        State::InFlight => {
            let need = head + LEASE_OFFSET;
            if value.len() < need {
                return Err(corrupt(Problem::Truncated {
                    len: value.len(),
                    need,
                }));
            }
            let mut offset = [0; LEASE_OFFSET];
            offset.copy_from_slice(&value[head..need]);
            let offset = i64::try_from(u64::from_be_bytes(offset)).unwrap_or(i64::MAX);
            (Some(non_negative(pttl.saturating_sub(offset))), need)
        }
        State::Completed | State::Failed => (None, head),
    };
    let mut payload = value;
    payload.drain(..payload_start);
    Ok(Record {
        token,
        fingerprint,
        state,
        payload,
        lease_remaining,
        retention_remaining: retention(pttl),
    })
}

fn non_negative(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

// `PTTL` is -1 for a key without expiry (only ever written by hand): it is
// kept until deleted. A record is never returned with zero retention left.
fn retention(pttl: i64) -> Duration {
    match pttl {
        -1 => Duration::MAX,
        ms => non_negative(ms).max(Duration::from_millis(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(state: State, lease: Option<Duration>, payload: &[u8]) -> Vec<u8> {
        let record = NewRecord {
            token: Token::from_bytes([3; 16]),
            fingerprint: Fingerprint::from_bytes([4; 32]),
            state,
            payload,
            lease,
            retention: Duration::from_secs(1),
        };
        redis::ToRedisArgs::to_redis_args(&Encoded::new(&record)).remove(0)
    }

    #[test]
    fn completed_record_round_trips_without_a_lease() {
        let value = value(State::Completed, None, b"out");
        assert_eq!(value.len(), HEAD + 3);
        let record = decode(b"k", value, 900).unwrap();
        assert_eq!(record.token, Token::from_bytes([3; 16]));
        assert_eq!(record.fingerprint, Fingerprint::from_bytes([4; 32]));
        assert_eq!(record.payload, b"out");
        assert_eq!(record.lease_remaining, None);
        assert_eq!(record.retention_remaining, Duration::from_millis(900));
    }

    #[test]
    fn lease_left_is_the_expiry_minus_the_stored_offset() {
        // Retention 1000 ms, lease 300 ms: the lease ends 700 ms before
        // the key expires.
        let value = value(State::InFlight, Some(Duration::from_millis(300)), b"p");
        let record = decode(b"k", value.clone(), 900).unwrap();
        assert_eq!(record.payload, b"p");
        assert_eq!(record.lease_remaining, Some(Duration::from_millis(200)));
        let lapsed = decode(b"k", value, 650).unwrap();
        assert_eq!(lapsed.lease_remaining, Some(Duration::ZERO));
        assert!(lapsed.lease_lapsed());
    }

    #[test]
    fn a_lease_longer_than_the_retention_ends_with_the_record() {
        let value = value(State::InFlight, Some(Duration::from_secs(5)), b"");
        let record = decode(b"k", value, 400).unwrap();
        assert_eq!(record.lease_remaining, Some(Duration::from_millis(400)));
    }

    #[test]
    fn every_malformed_value_is_corrupt_not_a_panic() {
        let mut bad_version = value(State::Completed, None, b"");
        bad_version[0] = 9;
        let mut bad_state = value(State::Completed, None, b"");
        bad_state[1] = 7;
        let short_in_flight = value(State::InFlight, None, b"")[..HEAD + 3].to_vec();
        for bad in [
            Vec::new(),
            b"garbage".to_vec(),
            bad_version,
            bad_state,
            short_in_flight,
        ] {
            let error = decode(b"k", bad, 10).unwrap_err();
            assert_eq!(
                error.kind(),
                idem_core::store::StoreErrorKind::Corrupt,
                "{error}"
            );
        }
    }

    #[test]
    fn zero_retention_left_is_reported_as_one_millisecond() {
        let record = decode(b"k", value(State::Failed, None, b""), 0).unwrap();
        assert_eq!(record.retention_remaining, Duration::from_millis(1));
    }

    #[test]
    fn durations_round_up_to_whole_milliseconds() {
        assert_eq!(millis(Duration::ZERO), 0);
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::from_millis(250)), 250);
        assert_eq!(millis(Duration::MAX), MAX_MS);
    }
}
