//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`.

use std::time::Duration;

use http::HeaderMap;

use super::{
    check_timestamp, hmac_sha256, parse_timestamp, single_header, Clock, SecretError, Secrets,
    Verified, Verifier, VerifyError, DEFAULT_TOLERANCE,
};

const SIGNATURE: &str = "stripe-signature";

/// Stripe's scheme.
///
/// The signature is `hex(HMAC-SHA256(secret, "{t}.{body}"))` under the
/// endpoint secret's bytes as given (`whsec_…`, prefix included).
/// `Stripe-Signature` holds `t=` once and one or more `v1=` entries (Stripe
/// sends two while a secret is being rolled); `v0=` and unknown entries are
/// ignored. The event id is the payload's `id`, not a header.
#[derive(Debug, Clone)]
pub struct Stripe {
    secrets: Secrets,
    tolerance: Duration,
    clock: Clock,
}

impl Stripe {
    /// A verifier accepting signatures under any of `secrets`.
    pub fn new<I, S>(secrets: I) -> Result<Stripe, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Stripe {
            secrets: Secrets::raw(secrets)?,
            tolerance: DEFAULT_TOLERANCE,
            clock: Clock::system(),
        })
    }

    /// How far `t` may be from now, either way (default five minutes).
    pub fn with_tolerance(mut self, tolerance: Duration) -> Stripe {
        self.tolerance = tolerance;
        self
    }

    /// The clock `t` is checked against (default: the system clock).
    pub fn with_clock(mut self, clock: Clock) -> Stripe {
        self.clock = clock;
        self
    }

    /// The `Stripe-Signature` value Stripe sends for this delivery, signed
    /// with the first secret.
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        let mac = mac(self.secrets.first(), timestamp, body);
        format!("t={timestamp},v1={}", hex::encode(mac))
    }
}

fn mac(key: &[u8], timestamp: i64, body: &[u8]) -> [u8; 32] {
    hmac_sha256(key, &[timestamp.to_string().as_bytes(), b".", body])
}

impl Verifier for Stripe {
    fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Verified, VerifyError> {
        let header = single_header(headers, SIGNATURE)?;
        let mut timestamp = None;
        let mut candidates = Vec::new();
        let mut any_v1 = false;
        for item in header.split(',') {
            let Some((name, value)) = item.trim().split_once('=') else {
                return Err(VerifyError::MalformedHeader {
                    header: SIGNATURE,
                    reason: "an entry is not `name=value`",
                });
            };
            match name {
                "t" if timestamp.is_some() => {
                    return Err(VerifyError::MalformedHeader {
                        header: SIGNATURE,
                        reason: "t= appears more than once",
                    })
                }
                "t" => timestamp = Some(parse_timestamp(SIGNATURE, value)?),
                "v1" => {
                    any_v1 = true;
                    if let Ok(bytes) = hex::decode(value) {
                        candidates.push(bytes);
                    }
                }
                _ => {}
            }
        }
        let timestamp = timestamp.ok_or(VerifyError::MalformedHeader {
            header: SIGNATURE,
            reason: "no t= timestamp",
        })?;
        if !any_v1 {
            return Err(VerifyError::MalformedHeader {
                header: SIGNATURE,
                reason: "no v1= signature",
            });
        }
        self.secrets
            .match_any(&candidates, |key| mac(key, timestamp, body))?;
        check_timestamp(&self.clock, self.tolerance, timestamp)?;
        Ok(Verified {
            event_id: None,
            timestamp: Some(timestamp),
            replayable: false,
        })
    }
}
