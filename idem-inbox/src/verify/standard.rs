//! Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use http::HeaderMap;

use super::{
    check_timestamp, hmac_sha256, parse_timestamp, single_header, Clock, SecretError, Secrets,
    Verified, Verifier, VerifyError, DEFAULT_TOLERANCE,
};

const ID: &str = "webhook-id";
const TIMESTAMP: &str = "webhook-timestamp";
const SIGNATURE: &str = "webhook-signature";

/// The [Standard Webhooks](https://www.standardwebhooks.com/) scheme.
///
/// The signature is `base64(HMAC-SHA256(secret, "{id}.{timestamp}.{body}"))`
/// under the secret's decoded bytes (a `whsec_` prefix is dropped, the rest
/// is base64). `webhook-signature` holds one or more space-separated
/// `v1,<signature>` entries; the delivery passes when any `v1` entry matches
/// under any configured secret, so a provider can sign with an old and a
/// new secret during rotation and a receiver can accept both. The id and
/// the timestamp are signed; the id is the event id.
#[derive(Debug, Clone)]
pub struct StandardWebhooks {
    secrets: Secrets,
    tolerance: Duration,
    clock: Clock,
}

impl StandardWebhooks {
    /// A verifier accepting signatures under any of `secrets`, each
    /// `whsec_<base64>` or bare base64.
    pub fn new<I, S>(secrets: I) -> Result<StandardWebhooks, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let secrets = Secrets::new(secrets, |s| {
            let s = s.strip_prefix("whsec_").unwrap_or(s);
            BASE64.decode(s).map_err(|_| SecretError::NotBase64)
        })?;
        Ok(StandardWebhooks {
            secrets,
            tolerance: DEFAULT_TOLERANCE,
            clock: Clock::system(),
        })
    }

    /// How far the signed timestamp may be from now, either way (default
    /// five minutes).
    pub fn with_tolerance(mut self, tolerance: Duration) -> StandardWebhooks {
        self.tolerance = tolerance;
        self
    }

    /// The clock the timestamp is checked against (default: the system
    /// clock).
    pub fn with_clock(mut self, clock: Clock) -> StandardWebhooks {
        self.clock = clock;
        self
    }

    /// The `webhook-signature` value a provider sends for this delivery,
    /// signed with the first secret: `v1,<base64>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mac = mac(self.secrets.first(), id, timestamp, body);
        format!("v1,{}", BASE64.encode(mac))
    }
}

fn mac(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
    let timestamp = timestamp.to_string();
    hmac_sha256(
        key,
        &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
    )
}

impl Verifier for StandardWebhooks {
    fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Verified, VerifyError> {
        let id = single_header(headers, ID)?;
        if id.is_empty() {
            return Err(VerifyError::MalformedHeader {
                header: ID,
                reason: "empty",
            });
        }
        let timestamp = parse_timestamp(TIMESTAMP, single_header(headers, TIMESTAMP)?)?;
        let header = single_header(headers, SIGNATURE)?;
        let mut candidates = Vec::new();
        for entry in header.split(' ').filter(|e| !e.is_empty()) {
            let Some((version, signature)) = entry.split_once(',') else {
                return Err(VerifyError::MalformedHeader {
                    header: SIGNATURE,
                    reason: "an entry is not `version,signature`",
                });
            };
            // Other versions (v1a is Ed25519) are skipped, not failed: a
            // provider may send them beside v1.
            if version == "v1" {
                // A v1 entry that is not base64 can match nothing.
                if let Ok(bytes) = BASE64.decode(signature) {
                    candidates.push(bytes);
                }
            }
        }
        if candidates.is_empty() && !header.split(' ').any(|e| e.starts_with("v1,")) {
            return Err(VerifyError::MalformedHeader {
                header: SIGNATURE,
                reason: "no v1 signature",
            });
        }
        // The signature is checked before the timestamp, so a forger learns
        // nothing about the tolerance window.
        self.secrets
            .match_any(&candidates, |key| mac(key, id, timestamp, body))?;
        check_timestamp(&self.clock, self.tolerance, timestamp)?;
        Ok(Verified {
            event_id: Some(id.to_owned()),
            timestamp: Some(timestamp),
            replayable: false,
        })
    }
}
