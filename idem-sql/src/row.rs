//! Between rows and records: durations out as microseconds, the columns of
//! a stored record in.

use std::time::Duration;

use idem_core::store::{Record, State, StoreError, Token};
use idem_core::Fingerprint;

/// The longest duration written: longer ones mean "as long as the database
/// can count" rather than an out-of-range date error, as `MemoryStore`
/// does. A century fits every SQL date type the stores use.
pub const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A duration as whole microseconds, rounded up so that a non-zero lease
/// never becomes a zero one, and at most [`LONGEST`].
pub fn micros(duration: Duration) -> i64 {
    let micros = duration.min(LONGEST).as_nanos().div_ceil(1_000);
    i64::try_from(micros).unwrap_or(i64::MAX)
}

/// A remaining time the database computed, in microseconds; a negative one
/// (a deadline passed while the statement ran) is zero.
pub fn remaining(micros: i64) -> Duration {
    Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}

/// Decodes a record from its columns' values as a SQL store keeps them:
/// the 16-byte token, the stored fingerprint (32 bytes for scheme 1, the
/// scheme's number in front for later ones, see `Fingerprint::stored`),
/// the state code (0 in flight, 1 completed, 2 failed), the payload, and
/// the lease and retention remaining in microseconds. A value that does
/// not decode is a corrupt-record error of `backend`.
pub fn record(
    backend: &'static str,
    token: &[u8],
    fingerprint: &[u8],
    code: i64,
    payload: Vec<u8>,
    lease_left: Option<i64>,
    retain_left: i64,
) -> Result<Record, StoreError> {
    let corrupt = |why: String| StoreError::corrupt(backend, why);
    let token = Token::try_from(token).map_err(|e| corrupt(e.to_string()))?;
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
        lease_remaining: (state == State::InFlight).then(|| remaining(lease_left.unwrap_or(0))),
        retention_remaining: remaining(retain_left),
    })
}

#[cfg(test)]
mod tests {
    use idem_core::store::StoreErrorKind;

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
        assert_eq!(remaining(-5), Duration::ZERO);
        assert_eq!(remaining(1_500), Duration::from_micros(1_500));
    }

    #[test]
    fn columns_decode_and_bad_ones_are_corrupt() {
        let token = [7u8; 16];
        let fingerprint = [1u8; 32];
        let record = record("t", &token, &fingerprint, 0, b"p".to_vec(), None, 9).unwrap();
        assert_eq!(record.state, State::InFlight);
        // No lease deadline in flight: lapsed, so the key can be taken over.
        assert_eq!(record.lease_remaining, Some(Duration::ZERO));
        assert_eq!(record.retention_remaining, Duration::from_micros(9));
        let done = super::record("t", &token, &fingerprint, 1, vec![], Some(5), 9).unwrap();
        assert_eq!(done.lease_remaining, None);
        for (token, fingerprint, code) in [
            (&token[..3], &fingerprint[..], 0),
            (&token[..], &fingerprint[..5], 0),
            (&token[..], &fingerprint[..], 3),
            (&token[..], &fingerprint[..], -1),
        ] {
            let error = super::record("t", token, fingerprint, code, vec![], None, 0).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Corrupt);
            assert_eq!(error.backend_name(), "t");
        }
    }
}
