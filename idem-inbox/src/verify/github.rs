//! GitHub: `X-Hub-Signature-256: sha256=<hex>`.

use http::HeaderMap;

use super::{hmac_sha256, single_header, SecretError, Secrets, Verified, Verifier, VerifyError};

const SIGNATURE: &str = "x-hub-signature-256";
const DELIVERY: &str = "x-github-delivery";

/// GitHub's scheme.
///
/// The signature is `sha256=` followed by `hex(HMAC-SHA256(secret, body))`
/// under the webhook secret's bytes. It covers the body only: GitHub signs
/// no timestamp and not the `X-GitHub-Delivery` header that gives the
/// event id, so a captured delivery verifies forever, under any delivery
/// id. The verifier marks it [`replayable`](Verified::replayable), and the
/// receiver dedupes it on the body's digest as well as on the id: a resend
/// under a new id is a duplicate, and so is GitHub's own redelivery, which
/// keeps the id. Two distinct events with byte-identical bodies would be
/// one; GitHub's bodies describe the event (its objects, their ids and
/// times), so distinct events differ in practice. Several secrets may be
/// configured for rotation.
#[derive(Debug, Clone)]
pub struct GitHub {
    secrets: Secrets,
}

impl GitHub {
    /// A verifier accepting signatures under any of `secrets`.
    pub fn new<I, S>(secrets: I) -> Result<GitHub, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(GitHub {
            secrets: Secrets::raw(secrets)?,
        })
    }

    /// The `X-Hub-Signature-256` value GitHub sends for `body`, signed with
    /// the first secret.
    pub fn sign(&self, body: &[u8]) -> String {
        format!(
            "sha256={}",
            hex::encode(hmac_sha256(self.secrets.first(), &[body]))
        )
    }
}

impl Verifier for GitHub {
    fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<Verified, VerifyError> {
        let header = single_header(headers, SIGNATURE)?;
        let signature = header
            .strip_prefix("sha256=")
            .ok_or(VerifyError::MalformedHeader {
                header: SIGNATURE,
                reason: "does not start with sha256=",
            })?;
        let candidate = hex::decode(signature).map_err(|_| VerifyError::MalformedHeader {
            header: SIGNATURE,
            reason: "the signature is not hex",
        })?;
        self.secrets
            .match_any(&[candidate], |key| hmac_sha256(key, &[body]))?;
        let event_id = match single_header(headers, DELIVERY) {
            Ok(id) if !id.is_empty() => Some(id.to_owned()),
            Ok(_) | Err(VerifyError::MissingHeader(_)) => None,
            Err(e) => return Err(e),
        };
        Ok(Verified {
            event_id,
            timestamp: None,
            replayable: true,
        })
    }
}
