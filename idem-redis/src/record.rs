//! The record encoding: one compact, versioned binary string per key.
//!
//! | bytes | what |
//! |---|---|
//! | 1 | layout version: `3`, or `4` for a fingerprint of a scheme after 1 (`1` and `2` before deadlines moved into the value) |
//! | 1 | state: `0` in flight, `1` completed, `2` failed |
//! | 16 | the owner's token |
//! | 32 (v3) or 33 (v4) | the request's fingerprint, in [`Fingerprint::stored`] form: v4 puts its scheme byte before the digest |
//! | 6 | the retention deadline: milliseconds since the Unix epoch on the server's clock, big-endian |
//! | 6 | in flight only: the lease deadline, the same way |
//! | rest | the payload |
//!
//! The key carries no Redis expiry, so a `volatile-*` maxmemory policy,
//! which evicts only keys with an expiry, never takes a record. A record
//! past its retention deadline reads as absent; the purge deletes it.
//!
//! Both deadlines live on the server's clock. The client sends durations
//! in the deadline fields; the script that writes the value adds the
//! server's `TIME` to them in the same step. No client clock is involved
//! anywhere. Six bytes of milliseconds last until the year 10889, and keep
//! a completed record with a 100-byte outcome in the allocator's size
//! class of the layouts before it.
//!
//! Layouts 1 and 2, written by earlier builds, are still read and replay
//! exactly: the same head without the retention deadline, the key's own
//! expiry (`PTTL`) as retention, and for a record in flight the lease
//! deadline as 8 bytes of milliseconds before that expiry. The scripts in
//! `lua/` read the same layouts; the two change together, with a new
//! version.

use std::io::Write;
use std::time::Duration;

use idem_core::store::{NewRecord, Record, State, StoreError, Token};
use idem_core::Fingerprint;

use crate::error::{CorruptRecord, Problem};
use redis::{RedisWrite, ToRedisArgs};

pub(crate) const BACKEND: &str = "redis";

/// The layout of a record with a scheme-1 fingerprint and its deadlines
/// in the value.
pub(crate) const VERSION: u8 = 3;

/// The layout of a record with a fingerprint of a later scheme.
pub(crate) const VERSION_SCHEMED: u8 = 4;

/// Layout 1, written by earlier builds: a scheme-1 fingerprint, the
/// retention as the key's expiry.
pub(crate) const VERSION_EXPIRING: u8 = 1;

/// Layout 2, written by earlier builds: layout 1 with a later scheme.
pub(crate) const VERSION_EXPIRING_SCHEMED: u8 = 2;

/// The token's bytes in a value: the same in every layout.
pub(crate) const TOKEN: std::ops::Range<usize> = 2..18;

/// Version, state, token and a scheme-1 fingerprint: the head of layouts
/// 1 and 3.
pub(crate) const HEAD: usize = TOKEN.end + 32;

/// The head of layouts 2 and 4: the fingerprint has its scheme byte in
/// front.
pub(crate) const HEAD_SCHEMED: usize = TOKEN.end + 33;

/// A deadline in layouts 3 and 4.
pub(crate) const DEADLINE: usize = 6;

/// Layouts 1 and 2: the in-flight lease deadline after the head, as ms
/// before the key's expiry.
pub(crate) const LEASE_OFFSET: usize = 8;

/// The head length of a layout version and whether it keeps its
/// deadlines in the value, `None` for a version this build does not read.
pub(crate) const fn head_len(version: u8) -> Option<(usize, bool)> {
    match version {
        VERSION => Some((HEAD, true)),
        VERSION_SCHEMED => Some((HEAD_SCHEMED, true)),
        VERSION_EXPIRING => Some((HEAD, false)),
        VERSION_EXPIRING_SCHEMED => Some((HEAD_SCHEMED, false)),
        _ => None,
    }
}

/// A record as sent to a script: its value (one argument, assembled in
/// the command's buffer), with durations where the stored record has
/// deadlines.
#[derive(Debug)]
pub(crate) struct Encoded<'a> {
    head: [u8; HEAD_SCHEMED + 2 * DEADLINE],
    head_len: usize,
    payload: &'a [u8],
}

impl<'a> Encoded<'a> {
    pub(crate) fn new(record: &NewRecord<'a>) -> Encoded<'a> {
        let fingerprint = record.fingerprint.stored();
        let mut head = [0; HEAD_SCHEMED + 2 * DEADLINE];
        let fingerprint_end = TOKEN.end + fingerprint.len();
        head[0] = if fingerprint_end == HEAD {
            VERSION
        } else {
            VERSION_SCHEMED
        };
        head[1] = record.state.as_u8();
        head[TOKEN].copy_from_slice(record.token.as_bytes());
        head[TOKEN.end..fingerprint_end].copy_from_slice(fingerprint);
        // At least 1 ms: a record is never written already lapsed.
        let retention_ms = millis(record.retention).max(1);
        let mut head_len = fingerprint_end + DEADLINE;
        head[fingerprint_end..head_len].copy_from_slice(&deadline_bytes(retention_ms));
        if record.state == State::InFlight {
            // In flight without a lease is a lease that has already lapsed;
            // a lease longer than the retention ends with the record.
            let lease_ms = record.lease.map_or(0, millis).min(retention_ms);
            head[head_len..head_len + DEADLINE].copy_from_slice(&deadline_bytes(lease_ms));
            head_len += DEADLINE;
        }
        Encoded {
            head,
            head_len,
            payload: record.payload,
        }
    }
}

impl Encoded<'_> {
    /// The value's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.head_len + self.payload.len()
    }

    /// The value as the server keeps it once written at `now_ms` on its
    /// clock: what the scripts make of it.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn stored_at(&self, now_ms: u64) -> Vec<u8> {
        let fingerprint_end = if self.head[0] == VERSION {
            HEAD
        } else {
            HEAD_SCHEMED
        };
        let mut value = self.head[..self.head_len].to_vec();
        for field in value[fingerprint_end..].chunks_mut(DEADLINE) {
            let at = now_ms + read_deadline(field);
            field.copy_from_slice(&deadline_bytes(at));
        }
        value.extend_from_slice(self.payload);
        value
    }
}

impl ToRedisArgs for Encoded<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        let _ = arg
            .write_all(&self.head[..self.head_len])
            .and_then(|()| arg.write_all(self.payload));
    }
}

// Durations are clamped to a century: added to the server's clock, a
// deadline still fits in six bytes.
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// Whole milliseconds, rounded up so that no deadline comes early.
pub(crate) fn millis(duration: Duration) -> u64 {
    let ms = duration.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(MAX_MS).min(MAX_MS)
}

fn deadline_bytes(ms: u64) -> [u8; DEADLINE] {
    let mut out = [0; DEADLINE];
    out.copy_from_slice(&ms.to_be_bytes()[8 - DEADLINE..]);
    out
}

fn read_deadline(bytes: &[u8]) -> u64 {
    let mut full = [0; 8];
    full[8 - DEADLINE..].copy_from_slice(&bytes[..DEADLINE]);
    u64::from_be_bytes(full)
}

/// The server's clock as a script read it with the record: its `TIME` in
/// milliseconds, and the key's `PTTL` (only read for layouts 1 and 2,
/// whose retention is the key's expiry).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    pub(crate) now_ms: i64,
    pub(crate) pttl: i64,
}

/// Decodes a record from its value and the server's clock, read together
/// on the server.
pub(crate) fn decode(key: &[u8], value: Vec<u8>, clock: Clock) -> Result<Record, StoreError> {
    let corrupt = |problem| StoreError::corrupt(BACKEND, CorruptRecord::new(key, problem));
    if value.len() < HEAD {
        return Err(corrupt(Problem::Truncated {
            len: value.len(),
            need: HEAD,
        }));
    }
    let (head, stamped) = head_len(value[0]).ok_or_else(|| corrupt(Problem::Version(value[0])))?;
    let state = State::from_u8(value[1]).ok_or_else(|| corrupt(Problem::State(value[1])))?;
    let deadlines = match (stamped, state) {
        (true, State::InFlight) => 2 * DEADLINE,
        (true, _) => DEADLINE,
        (false, State::InFlight) => LEASE_OFFSET,
        (false, _) => 0,
    };
    let need = head + deadlines;
    if value.len() < need {
        return Err(corrupt(Problem::Truncated {
            len: value.len(),
            need,
        }));
    }
    let token = Token::try_from(&value[TOKEN]).map_err(|e| corrupt(Problem::Parse(e)))?;
    let fingerprint =
        Fingerprint::try_from(&value[TOKEN.end..head]).map_err(|e| corrupt(Problem::Parse(e)))?;
    let left = |deadline: &[u8]| {
        let deadline = i64::try_from(read_deadline(deadline)).unwrap_or(i64::MAX);
        deadline.saturating_sub(clock.now_ms)
    };
    let (lease_remaining, retention_remaining) = if stamped {
        let lease =
            (state == State::InFlight).then(|| non_negative(left(&value[head + DEADLINE..need])));
        (lease, retained(left(&value[head..head + DEADLINE])))
    } else {
        let lease = (state == State::InFlight).then(|| {
            let mut offset = [0; LEASE_OFFSET];
            offset.copy_from_slice(&value[head..need]);
            let offset = i64::try_from(u64::from_be_bytes(offset)).unwrap_or(i64::MAX);
            non_negative(clock.pttl.saturating_sub(offset))
        });
        let retention = match clock.pttl {
            // A layout-1 or -2 key without expiry (only ever written by
            // hand) is kept until deleted.
            -1 => Duration::MAX,
            ms => retained(ms),
        };
        (lease, retention)
    };
    let mut payload = value;
    payload.drain(..need);
    Ok(Record {
        token,
        fingerprint,
        state,
        payload,
        lease_remaining,
        retention_remaining,
    })
}

fn non_negative(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

// A record is never returned with zero retention left: the scripts read a
// record past its deadline as absent.
fn retained(ms: i64) -> Duration {
    non_negative(ms).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn at(now_ms: i64) -> Clock {
        Clock { now_ms, pttl: 0 }
    }

    fn value(state: State, lease: Option<Duration>, payload: &[u8]) -> Vec<u8> {
        let record = NewRecord {
            token: Token::from_bytes([3; 16]),
            fingerprint: Fingerprint::from_bytes([4; 32]),
            state,
            payload,
            lease,
            retention: Duration::from_secs(1),
        };
        Encoded::new(&record).stored_at(NOW as u64)
    }

    #[test]
    fn what_is_sent_carries_durations_where_the_record_keeps_deadlines() {
        let record = NewRecord {
            token: Token::from_bytes([3; 16]),
            fingerprint: Fingerprint::from_bytes([4; 32]),
            state: State::InFlight,
            payload: b"p",
            lease: Some(Duration::from_millis(300)),
            retention: Duration::from_secs(1),
        };
        let sent = redis::ToRedisArgs::to_redis_args(&Encoded::new(&record)).remove(0);
        assert_eq!(sent[0], VERSION);
        assert_eq!(read_deadline(&sent[HEAD..]), 1000);
        assert_eq!(read_deadline(&sent[HEAD + DEADLINE..]), 300);
        let stored = Encoded::new(&record).stored_at(5);
        assert_eq!(read_deadline(&stored[HEAD..]), 1005);
        assert_eq!(read_deadline(&stored[HEAD + DEADLINE..]), 305);
        assert_eq!(stored.len(), sent.len());
    }

    #[test]
    fn completed_record_round_trips_without_a_lease() {
        let value = value(State::Completed, None, b"out");
        assert_eq!(value.len(), HEAD + DEADLINE + 3);
        let record = decode(b"k", value, at(NOW + 100)).unwrap();
        assert_eq!(record.token, Token::from_bytes([3; 16]));
        assert_eq!(record.fingerprint, Fingerprint::from_bytes([4; 32]));
        assert_eq!(record.payload, b"out");
        assert_eq!(record.lease_remaining, None);
        assert_eq!(record.retention_remaining, Duration::from_millis(900));
    }

    #[test]
    fn lease_left_is_its_deadline_minus_the_servers_now() {
        let value = value(State::InFlight, Some(Duration::from_millis(300)), b"p");
        let record = decode(b"k", value.clone(), at(NOW + 100)).unwrap();
        assert_eq!(record.payload, b"p");
        assert_eq!(record.lease_remaining, Some(Duration::from_millis(200)));
        let lapsed = decode(b"k", value, at(NOW + 350)).unwrap();
        assert_eq!(lapsed.lease_remaining, Some(Duration::ZERO));
        assert!(lapsed.lease_lapsed());
    }

    #[test]
    fn a_lease_longer_than_the_retention_ends_with_the_record() {
        let value = value(State::InFlight, Some(Duration::from_secs(5)), b"");
        let record = decode(b"k", value, at(NOW + 600)).unwrap();
        assert_eq!(record.lease_remaining, Some(Duration::from_millis(400)));
    }

    /// A value of layout 1, as earlier builds wrote it (the lease as ms
    /// before the key's expiry).
    fn layout_1(state: u8, offset: Option<u64>, payload: &[u8]) -> Vec<u8> {
        let mut value = vec![VERSION_EXPIRING, state];
        value.extend_from_slice(&[3; 16]);
        value.extend_from_slice(&[4; 32]);
        if let Some(offset) = offset {
            value.extend_from_slice(&offset.to_be_bytes());
        }
        value.extend_from_slice(payload);
        value
    }

    #[test]
    fn layouts_written_by_earlier_builds_read_their_deadlines_from_the_expiry() {
        let clock = |pttl| Clock { now_ms: NOW, pttl };
        let done = decode(b"k", layout_1(1, None, b"out"), clock(900)).unwrap();
        assert_eq!(
            (done.state, done.payload, done.retention_remaining),
            (
                State::Completed,
                b"out".to_vec(),
                Duration::from_millis(900)
            )
        );
        // Retention 1000 ms, lease 300 ms: the lease ends 700 ms before
        // the key expires.
        let flying = decode(b"k", layout_1(0, Some(700), b"p"), clock(900)).unwrap();
        assert_eq!(flying.lease_remaining, Some(Duration::from_millis(200)));
        assert_eq!(flying.payload, b"p");
        let lapsed = decode(b"k", layout_1(0, Some(700), b""), clock(650)).unwrap();
        assert_eq!(lapsed.lease_remaining, Some(Duration::ZERO));
        let kept = decode(b"k", layout_1(2, None, b""), clock(-1)).unwrap();
        assert_eq!(kept.retention_remaining, Duration::MAX);
        let mut schemed = vec![VERSION_EXPIRING_SCHEMED, 1];
        schemed.extend_from_slice(&[3; 16]);
        schemed.push(2);
        schemed.extend_from_slice(&[4; 32]);
        schemed.extend_from_slice(b"x");
        let schemed = decode(b"k", schemed, clock(10)).unwrap();
        assert_eq!(schemed.payload, b"x");
    }

    #[test]
    fn every_malformed_value_is_corrupt_not_a_panic() {
        let mut bad_version = value(State::Completed, None, b"");
        bad_version[0] = 9;
        let mut bad_state = value(State::Completed, None, b"");
        bad_state[1] = 7;
        let short_in_flight = value(State::InFlight, None, b"")[..HEAD + DEADLINE + 3].to_vec();
        let short_settled = value(State::Completed, None, b"")[..HEAD + 2].to_vec();
        let short_legacy = layout_1(0, None, b"");
        for bad in [
            Vec::new(),
            b"garbage".to_vec(),
            bad_version,
            bad_state,
            short_in_flight,
            short_settled,
            short_legacy,
        ] {
            let error = decode(b"k", bad, at(NOW)).unwrap_err();
            assert_eq!(
                error.kind(),
                idem_core::store::StoreErrorKind::Corrupt,
                "{error}"
            );
        }
    }

    #[test]
    fn retention_left_is_never_reported_as_zero() {
        let record = decode(b"k", value(State::Failed, None, b""), at(NOW + 5000)).unwrap();
        assert_eq!(record.retention_remaining, Duration::from_millis(1));
    }

    #[test]
    fn the_longest_deadline_fits_its_six_bytes() {
        let far = NOW as u64 + MAX_MS;
        assert_eq!(read_deadline(&deadline_bytes(far)), far);
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
