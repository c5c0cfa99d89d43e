//! What every row sends: the request body, the work's outcome, and their
//! encodings, sized so that store rows and raw rows move the same bytes.

use std::time::Duration;

use idem_core::store::Token;
use idem_core::Fingerprint;
use serde::{Deserialize, Serialize};

/// The error type every harness step returns: a harness has no caller that
/// matches on it, it only prints it.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long bench records are kept. Long enough for any run; short enough
/// that a run killed before its cleanup leaves nothing for long.
pub(crate) const RETENTION: Duration = Duration::from_secs(60 * 60);

/// The lease every claim takes (the library's default).
pub(crate) const LEASE: Duration = idem_core::DEFAULT_LEASE;

/// The request body: a payment order whose JSON form is 100 bytes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Order {
    amount: u64,
    currency: String,
    customer: String,
    description: String,
}

impl Order {
    /// The order every row sends.
    pub(crate) fn sample() -> Order {
        Order {
            amount: 1250,
            currency: "EUR".to_owned(),
            customer: "cus_4f9a2c81d0e7".to_owned(),
            description: "monthly plan 2024-117".to_owned(),
        }
    }
}

/// The work's outcome: a string whose JSON form is 100 bytes.
pub(crate) fn outcome() -> String {
    "ch_".to_owned() + &"7".repeat(95)
}

/// The outcome as a store holds it: its JSON encoding.
pub(crate) fn outcome_payload() -> Vec<u8> {
    // A String always encodes.
    serde_json::to_vec(&outcome()).unwrap_or_default()
}

/// The outcome payload as an HTTP handler sends it: made once, so that a
/// handler's cost is the framework's, not the encoding of its answer.
pub(crate) fn outcome_body() -> bytes::Bytes {
    static BODY: std::sync::LazyLock<bytes::Bytes> =
        std::sync::LazyLock::new(|| bytes::Bytes::from(outcome_payload()));
    BODY.clone()
}

/// The body's fingerprint, computed once: the raw rows send a fixed one, so
/// hashing the body counts as idem's cost, not the store's.
pub(crate) fn fingerprint() -> Fingerprint {
    Fingerprint::of_json(&Order::sample()).unwrap_or_else(|_| Fingerprint::of_bytes(b"order"))
}

/// A fresh owner token for a raw claim.
pub(crate) fn token() -> Token {
    Token::random()
}

/// A short random tag that keeps this run's keys, tables and files apart
/// from any other run's.
pub(crate) fn run_tag() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// Milliseconds in a duration, as the integer the stores take.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_and_outcome_are_one_hundred_bytes_of_json() {
        assert_eq!(serde_json::to_vec(&Order::sample()).unwrap().len(), 100);
        assert_eq!(outcome_payload().len(), 100);
    }
}
