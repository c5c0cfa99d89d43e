//! Webhook verification over the raw body bytes.
//!
//! A [`Verifier`] checks that a delivery was signed by its provider: it
//! recomputes the provider's HMAC over the exact bytes received and compares
//! it in constant time (or, for Standard Webhooks' `v1a`, checks the
//! provider's Ed25519 signature against its public keys), and, where the
//! scheme signs a timestamp, rejects
//! deliveries outside a tolerance window on either side of now (five minutes
//! by default), which bounds how long a captured delivery can be replayed.
//!
//! # What each scheme signs, and what a replay can do
//!
//! Someone who captured a genuine delivery can send it again, and can
//! change whatever the signature does not cover. The
//! [`Receiver`](crate::Receiver) dedupes on (source, event id), and on
//! the body's digest where the id is not signed and no timestamp bounds
//! the resend:
//!
//! | Scheme | Signed | A replay can | A replay cannot |
//! |---|---|---|---|
//! | [`StandardWebhooks`] (`v1` HMAC, `v1a` Ed25519) | id, timestamp, body | resend it verbatim within the tolerance: a duplicate by its id | change the id, or resend it once the tolerance has passed |
//! | [`Stripe`] | timestamp, body (whose `id` is the event id) | resend it verbatim within the tolerance: a duplicate by its id | change the id, or resend it once the tolerance has passed |
//! | [`GitHub`] | body | resend it at any time, under any `X-GitHub-Delivery`: a duplicate by the body's digest (and by the id, when it keeps it) | change the body |
//! | [`SecretHeader`] | nothing: the secret itself travels | resend it at any time: a duplicate by the id in its body; and, holding the secret, send any body at all | — |
//!
//! The shared-secret scheme dedupes on its event id only. Its id is read
//! from the body (Telegram's `update_id`), so a verbatim resend already
//! has the id of the first; a body digest would stop only a changed body,
//! and whoever captured one delivery holds the secret and can forge any
//! body, id and all. What bounds it is keeping the secret and the
//! transport (TLS) private.
//!
//! Every failure is a [`VerifyError`]; nothing here panics on hostile input.
//! Verify before parsing: a body re-serialised from parsed JSON is not the
//! body that was signed, and fails.

mod github;
mod secret_header;
mod standard;
mod stripe;

use std::fmt;
use std::time::Duration;

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;

pub use crate::clock::Clock;
pub use github::GitHub;
pub use secret_header::SecretHeader;
pub use standard::{StandardWebhooks, MAX_V1A_SIGNATURES};
pub use stripe::Stripe;

/// How far a signed timestamp may be from now, either way, by default.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Checks that a delivery comes from its provider.
pub trait Verifier: Send + Sync + fmt::Debug + 'static {
    /// Verifies `body`, the raw bytes received, against `headers`.
    ///
    /// Returns what the verification found: the event id when the scheme
    /// carries one in a header, the signed timestamp, and whether the
    /// signature leaves a verbatim resend under a new id open
    /// ([`Verified::replayable`]). Only what the signature covers is
    /// vouched for; each scheme's docs say what that is.
    fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Verified, VerifyError>;
}

/// What a successful verification found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Verified {
    /// The event id from the scheme's header (`webhook-id`,
    /// `X-GitHub-Delivery`), when it has one. Stripe and Telegram put theirs
    /// in the payload. Standard Webhooks signs it; GitHub does not, so a
    /// sender may put any id beside a body it captured.
    pub event_id: Option<String>,
    /// The signed timestamp, in seconds since the Unix epoch, when the
    /// scheme signs one.
    pub timestamp: Option<i64>,
    /// The signature covers the body but neither the event id nor a
    /// timestamp (GitHub): a captured delivery verifies forever under any
    /// id, so the [`Receiver`](crate::Receiver) dedupes it on the body's
    /// digest as well as on the id.
    pub replayable: bool,
}

/// Why a delivery failed verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A header the scheme needs is absent.
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    /// A header the scheme needs once came more than once, so which one was
    /// signed is ambiguous.
    #[error("the {0} header came more than once")]
    DuplicateHeader(&'static str),
    /// A header is present but cannot be read.
    #[error("the {header} header is malformed: {reason}")]
    MalformedHeader {
        /// The header.
        header: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The signed timestamp is older than the tolerance allows.
    #[error("the signed timestamp is {age_secs} s old, more than the tolerance allows")]
    TimestampTooOld {
        /// How old it is, in seconds.
        age_secs: i64,
    },
    /// The signed timestamp is further ahead than the tolerance allows.
    #[error(
        "the signed timestamp is {ahead_secs} s in the future, more than the tolerance allows"
    )]
    TimestampInFuture {
        /// How far ahead it is, in seconds.
        ahead_secs: i64,
    },
    /// No signature matched any configured secret: a forged or altered
    /// delivery, or a wrong secret.
    #[error("no signature matches the body under any configured secret")]
    SignatureMismatch,
}

/// A secret a verifier was built with cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// No secret was given.
    #[error("at least one secret is needed")]
    None,
    /// A secret is empty.
    #[error("a secret is empty")]
    Empty,
    /// A `whsec_` secret, or a `whpk_` or `whsk_` key, is not valid
    /// base64.
    #[error("a whsec_ secret or a whpk_/whsk_ key is not valid base64")]
    NotBase64,
    /// A `whpk_` key is not an Ed25519 public key (32 bytes encoding a
    /// point of the curve).
    #[error("a whpk_ key is not an Ed25519 public key")]
    NotAPublicKey,
    /// A `whsk_` key is not an Ed25519 secret key (a 32-byte seed, or the
    /// seed and its public key in 64 bytes).
    #[error("a whsk_ key is not an Ed25519 secret key")]
    NotASecretKey,
}

/// The one value of `name`, as text.
fn single_header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, VerifyError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(VerifyError::MissingHeader(name))?;
    if values.next().is_some() {
        return Err(VerifyError::DuplicateHeader(name));
    }
    value.to_str().map_err(|_| VerifyError::MalformedHeader {
        header: name,
        reason: "not visible ASCII",
    })
}

/// Parses a decimal Unix timestamp from `header`.
fn parse_timestamp(header: &'static str, text: &str) -> Result<i64, VerifyError> {
    let malformed = VerifyError::MalformedHeader {
        header,
        reason: "the timestamp is not a decimal number of seconds",
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed);
    }
    text.parse().map_err(|_| malformed)
}

/// Checks `timestamp` is within `tolerance` of the clock, either way.
fn check_timestamp(clock: &Clock, tolerance: Duration, timestamp: i64) -> Result<(), VerifyError> {
    let now = clock.now_unix();
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    let age = now.saturating_sub(timestamp);
    if age > tolerance {
        Err(VerifyError::TimestampTooOld { age_secs: age })
    } else if age < -tolerance {
        Err(VerifyError::TimestampInFuture {
            ahead_secs: age.saturating_neg(),
        })
    } else {
        Ok(())
    }
}

/// HMAC-SHA256 of the concatenated `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length; new_from_slice cannot fail for it.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// Whether `candidate` equals `expected`, in time that does not depend on
/// where they differ.
fn constant_time_eq(expected: &[u8], candidate: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    expected.ct_eq(candidate).into()
}

/// Secrets kept out of `Debug` output.
#[derive(Clone)]
struct Secrets(Vec<Vec<u8>>);

impl Secrets {
    fn new<I, S>(
        secrets: I,
        decode: impl Fn(&str) -> Result<Vec<u8>, SecretError>,
    ) -> Result<Secrets, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let keys = secrets
            .into_iter()
            .map(|s| {
                let key = decode(s.as_ref())?;
                if key.is_empty() {
                    Err(SecretError::Empty)
                } else {
                    Ok(key)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(SecretError::None);
        }
        Ok(Secrets(keys))
    }

    fn raw<I, S>(secrets: I) -> Result<Secrets, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Secrets::new(secrets, |s| Ok(s.as_bytes().to_vec()))
    }

    /// Passes when any candidate equals the MAC `mac` computes under any
    /// secret; every comparison runs in constant time.
    fn match_any(
        &self,
        candidates: &[Vec<u8>],
        mac: impl Fn(&[u8]) -> [u8; 32],
    ) -> Result<(), VerifyError> {
        let matched = self.iter().any(|key| {
            let expected = mac(key);
            candidates
                .iter()
                .fold(false, |any, c| any | constant_time_eq(&expected, c))
        });
        if matched {
            Ok(())
        } else {
            Err(VerifyError::SignatureMismatch)
        }
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.0.iter().map(Vec::as_slice)
    }

    fn first(&self) -> &[u8] {
        &self.0[0]
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{} secret(s), redacted]", self.0.len())
    }
}
