//! Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature`.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use http::HeaderMap;

use super::{
    check_timestamp, hmac_sha256, parse_timestamp, single_header, Clock, SecretError, Secrets,
    Verified, Verifier, VerifyError, DEFAULT_TOLERANCE,
};

const ID: &str = "webhook-id";
const TIMESTAMP: &str = "webhook-timestamp";
const SIGNATURE: &str = "webhook-signature";

/// The most `v1a` entries one delivery may carry: each costs an Ed25519
/// verification per trusted key, so a header stuffed with entries must not
/// buy a forger that much work. Rotation needs two or three.
pub const MAX_V1A_SIGNATURES: usize = 8;

/// The [Standard Webhooks](https://www.standardwebhooks.com/) scheme, in
/// both its signature versions.
///
/// * `v1` (symmetric): `base64(HMAC-SHA256(secret, "{id}.{timestamp}.{body}"))`
///   under the secret's decoded bytes (a `whsec_` prefix is dropped, the
///   rest is base64), compared in constant time.
/// * `v1a` (asymmetric): `base64(Ed25519-sign(key, "{id}.{timestamp}.{body}"))`,
///   checked against the provider's public keys (`whpk_` and the base64 of
///   the 32-byte key), with `ed25519-dalek`'s strict verification (no
///   malleable or small-order signatures). The provider keeps the secret
///   key (`whsk_`), so a leaked receiver configuration forges nothing; the
///   spec recommends it over `v1` for that reason.
///
/// `webhook-signature` holds one or more space-separated `version,signature`
/// entries. The delivery passes when any entry of a version the verifier
/// trusts matches under any of its secrets or keys, so a provider can sign
/// with an old and a new key during rotation (and with both versions) and
/// the receiver accepts both. Entries of a version it does not trust are
/// skipped. The id and the timestamp are signed; the id is the event id.
#[derive(Debug, Clone)]
pub struct StandardWebhooks {
    secrets: Option<Secrets>,
    public_keys: Vec<VerifyingKey>,
    tolerance: Duration,
    clock: Clock,
}

impl StandardWebhooks {
    /// A verifier accepting `v1` signatures under any of `secrets`, each
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
            secrets: Some(secrets),
            public_keys: Vec::new(),
            tolerance: DEFAULT_TOLERANCE,
            clock: Clock::system(),
        })
    }

    /// A verifier accepting `v1a` (Ed25519) signatures under any of
    /// `public_keys`, each `whpk_<base64>` or bare base64 of the 32-byte
    /// key, and no `v1` signature.
    pub fn from_public_keys<I, S>(public_keys: I) -> Result<StandardWebhooks, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let public_keys = public_keys
            .into_iter()
            .map(|key| public_key(key.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if public_keys.is_empty() {
            return Err(SecretError::None);
        }
        Ok(StandardWebhooks {
            secrets: None,
            public_keys,
            tolerance: DEFAULT_TOLERANCE,
            clock: Clock::system(),
        })
    }

    /// Also accepts `v1a` signatures under any of `public_keys` (as in
    /// [`from_public_keys`](StandardWebhooks::from_public_keys)), for a
    /// provider moving from `v1` to `v1a` or signing with both.
    pub fn with_public_keys<I, S>(mut self, public_keys: I) -> Result<StandardWebhooks, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for key in public_keys {
            self.public_keys.push(public_key(key.as_ref())?);
        }
        Ok(self)
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
    /// signed with the first secret: `v1,<base64>`. A verifier built from
    /// public keys alone holds no secret and returns an empty value, which
    /// no verifier accepts; sign those with
    /// [`sign_v1a`](StandardWebhooks::sign_v1a).
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        match &self.secrets {
            Some(secrets) => {
                let mac = mac(secrets.first(), id, timestamp, body);
                format!("v1,{}", BASE64.encode(mac))
            }
            None => String::new(),
        }
    }

    /// The `webhook-signature` entry a provider holding `secret_key` sends
    /// for this delivery: `v1a,<base64>`. The key is `whsk_` and the base64
    /// of the 32-byte Ed25519 seed, or of the 64-byte seed and public key
    /// (libsodium's form, whose halves must agree).
    pub fn sign_v1a(
        secret_key: &str,
        id: &str,
        timestamp: i64,
        body: &[u8],
    ) -> Result<String, SecretError> {
        let key = signing_key(secret_key)?;
        let signature = key.sign(&signed_content(id, timestamp, body));
        Ok(format!("v1a,{}", BASE64.encode(signature.to_bytes())))
    }

    /// The `whpk_` public key of `secret_key` (as in
    /// [`sign_v1a`](StandardWebhooks::sign_v1a)): what a provider hands its
    /// receivers.
    pub fn public_key_of(secret_key: &str) -> Result<String, SecretError> {
        let key = signing_key(secret_key)?;
        Ok(format!(
            "whpk_{}",
            BASE64.encode(key.verifying_key().as_bytes())
        ))
    }
}

fn public_key(text: &str) -> Result<VerifyingKey, SecretError> {
    let text = text.strip_prefix("whpk_").unwrap_or(text);
    let bytes = BASE64.decode(text).map_err(|_| SecretError::NotBase64)?;
    let bytes: [u8; 32] = bytes.try_into().map_err(|_| SecretError::NotAPublicKey)?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| SecretError::NotAPublicKey)
}

fn signing_key(text: &str) -> Result<SigningKey, SecretError> {
    let text = text.strip_prefix("whsk_").unwrap_or(text);
    let bytes = BASE64.decode(text).map_err(|_| SecretError::NotBase64)?;
    match bytes.len() {
        32 => {
            let mut seed = [0; 32];
            seed.copy_from_slice(&bytes);
            Ok(SigningKey::from_bytes(&seed))
        }
        64 => {
            let mut pair = [0; 64];
            pair.copy_from_slice(&bytes);
            SigningKey::from_keypair_bytes(&pair).map_err(|_| SecretError::NotASecretKey)
        }
        _ => Err(SecretError::NotASecretKey),
    }
}

fn signed_content(id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let timestamp = timestamp.to_string();
    let mut content = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
    content.extend_from_slice(id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
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
        let (mut macs, mut signatures) = (Vec::new(), Vec::new());
        let (mut v1, mut v1a) = (false, false);
        for entry in header.split(' ').filter(|e| !e.is_empty()) {
            let Some((version, signature)) = entry.split_once(',') else {
                return Err(VerifyError::MalformedHeader {
                    header: SIGNATURE,
                    reason: "an entry is not `version,signature`",
                });
            };
            // Versions this verifier does not trust are skipped, not
            // failed: a provider may send them beside the one it does.
            match version {
                "v1" if self.secrets.is_some() => {
                    v1 = true;
                    // A v1 entry that is not base64 can match nothing.
                    if let Ok(bytes) = BASE64.decode(signature) {
                        macs.push(bytes);
                    }
                }
                "v1a" if !self.public_keys.is_empty() => {
                    v1a = true;
                    if signatures.len() == MAX_V1A_SIGNATURES {
                        return Err(VerifyError::MalformedHeader {
                            header: SIGNATURE,
                            reason: "more v1a signatures than a delivery may carry",
                        });
                    }
                    // Nor can one that is not 64 bytes of base64.
                    let bytes = BASE64.decode(signature).ok();
                    if let Some(bytes) = bytes.and_then(|b| <[u8; 64]>::try_from(b).ok()) {
                        signatures.push(Signature::from_bytes(&bytes));
                    }
                }
                _ => {}
            }
        }
        if !v1 && !v1a {
            return Err(VerifyError::MalformedHeader {
                header: SIGNATURE,
                reason: match (self.secrets.is_some(), self.public_keys.is_empty()) {
                    (true, true) => "no v1 signature",
                    (false, _) => "no v1a signature",
                    (true, false) => "no v1 or v1a signature",
                },
            });
        }
        // The signature is checked before the timestamp, so a forger learns
        // nothing about the tolerance window.
        let by_mac = match &self.secrets {
            Some(secrets) => secrets
                .match_any(&macs, |key| mac(key, id, timestamp, body))
                .is_ok(),
            None => false,
        };
        if !by_mac {
            let content = signed_content(id, timestamp, body);
            let by_key = self.public_keys.iter().any(|key| {
                signatures
                    .iter()
                    .any(|signature| key.verify_strict(&content, signature).is_ok())
            });
            if !by_key {
                return Err(VerifyError::SignatureMismatch);
            }
        }
        check_timestamp(&self.clock, self.tolerance, timestamp)?;
        Ok(Verified {
            event_id: Some(id.to_owned()),
            timestamp: Some(timestamp),
            replayable: false,
        })
    }
}
