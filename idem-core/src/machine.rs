//! The decision on a hit: the one place that reads a found record.

use std::time::Duration;

use crate::fingerprint::MatchingFingerprints;
use crate::store::{Record, State, Token};

/// What to do about a live record found under the key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Another request made this record.
    Mismatch,
    /// The owner's lease is live.
    InProgress(Duration),
    /// The owner's lease lapsed; take the key over from this token.
    TakeOver(Token),
    /// The outcome is recorded; replay it.
    Replay,
}

/// Decides, in the order the design fixes: the fingerprint before the state
/// (a different request under an in-flight key is a mismatch, not a
/// conflict), then the lease, then the recorded outcome. The record's
/// fingerprint is compared with the request's fingerprint of the same
/// scheme, so records made under an older scheme keep matching.
pub(crate) fn decide(record: &Record, fingerprints: &MatchingFingerprints) -> Decision {
    if !fingerprints.matches(&record.fingerprint) {
        return Decision::Mismatch;
    }
    match record.state {
        State::InFlight if record.lease_lapsed() => Decision::TakeOver(record.token),
        State::InFlight => Decision::InProgress(record.lease_remaining.unwrap_or_default()),
        State::Completed | State::Failed => Decision::Replay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fingerprint;

    fn record(state: State, lease: Option<u64>) -> Record {
        Record {
            token: Token::from_bytes([7; 16]),
            fingerprint: Fingerprint::of_bytes(b"a"),
            state,
            payload: Vec::new(),
            lease_remaining: lease.map(Duration::from_millis),
            retention_remaining: Duration::from_secs(60),
        }
    }

    #[test]
    fn mismatch_wins_over_in_progress() {
        let other = Fingerprint::of_bytes(b"b");
        assert_eq!(
            decide(&record(State::InFlight, Some(500)), &other.into()),
            Decision::Mismatch
        );
    }

    #[test]
    fn each_state_has_its_decision() {
        let same = Fingerprint::of_bytes(b"a").into();
        assert_eq!(
            decide(&record(State::InFlight, Some(500)), &same),
            Decision::InProgress(Duration::from_millis(500))
        );
        assert_eq!(
            decide(&record(State::InFlight, Some(0)), &same),
            Decision::TakeOver(Token::from_bytes([7; 16]))
        );
        assert_eq!(
            decide(&record(State::Completed, None), &same),
            Decision::Replay
        );
        assert_eq!(
            decide(&record(State::Failed, None), &same),
            Decision::Replay
        );
    }

    #[test]
    fn an_older_scheme_record_is_decided_by_its_own_scheme() {
        let newer = Fingerprint::of_bytes(b"canonical").with_scheme(2);
        let request = newer.also_matching(Fingerprint::of_bytes(b"a"));
        assert_eq!(
            decide(&record(State::Completed, None), &request),
            Decision::Replay
        );
        assert_eq!(
            decide(&record(State::Completed, None), &newer.into()),
            Decision::Mismatch
        );
    }
}
