//! AWS Signature Version 4 for the store's `POST /` calls, on hmac and
//! sha2. Only what DynamoDB's JSON protocol needs: one path (`/`), no
//! query string, a body hashed whole, five headers signed.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// AWS credentials: an access key, its secret and, for temporary
/// credentials (Lambda's, a role's), a session token.
#[derive(Clone)]
pub struct Credentials {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

impl Credentials {
    /// Credentials from their parts.
    pub fn new(
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
        session_token: Option<String>,
    ) -> Credentials {
        Credentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token,
        }
    }

    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, when set,
    /// `AWS_SESSION_TOKEN`: what Lambda, ECS task roles made into
    /// environment variables and most CI systems provide. `None` when
    /// either of the first two is missing.
    pub fn from_env() -> Option<Credentials> {
        let id = std::env::var("AWS_ACCESS_KEY_ID").ok()?;
        let secret = std::env::var("AWS_SECRET_ACCESS_KEY").ok()?;
        let token = std::env::var("AWS_SESSION_TOKEN")
            .ok()
            .filter(|t| !t.is_empty());
        Some(Credentials::new(id, secret, token))
    }

    /// The access key id (not secret).
    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret and the session token are never printed.
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// The headers a signed call carries besides its content type and target.
#[derive(Debug)]
pub(crate) struct Signed {
    pub(crate) amz_date: String,
    pub(crate) authorization: String,
    pub(crate) security_token: Option<String>,
}

pub(crate) const CONTENT_TYPE: &str = "application/x-amz-json-1.0";

/// Signs a `POST /` to `host` (with `:port` when the URL names one) for
/// DynamoDB in `region`, at `time`.
pub(crate) fn sign(
    credentials: &Credentials,
    region: &str,
    host: &str,
    target: &str,
    body: &[u8],
    time: SystemTime,
) -> Signed {
    let (date, amz_date) = stamp(time);
    let token = credentials.session_token.as_deref();
    let mut canonical_headers =
        format!("content-type:{CONTENT_TYPE}\nhost:{host}\nx-amz-date:{amz_date}\n");
    let mut signed_headers = String::from("content-type;host;x-amz-date");
    if let Some(token) = token {
        canonical_headers.push_str(&format!("x-amz-security-token:{token}\n"));
        signed_headers.push_str(";x-amz-security-token");
    }
    canonical_headers.push_str(&format!("x-amz-target:{target}\n"));
    signed_headers.push_str(";x-amz-target");
    let canonical = format!(
        "POST\n/\n\n{canonical_headers}\n{signed_headers}\n{}",
        hex::encode(Sha256::digest(body))
    );
    let scope = format!("{date}/{region}/dynamodb/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(
        format!("AWS4{}", credentials.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    for part in [region, "dynamodb", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, to_sign.as_bytes()));
    Signed {
        authorization: format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            credentials.access_key_id
        ),
        amz_date,
        security_token: token.map(str::to_owned),
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// `YYYYMMDD` and `YYYYMMDDTHHMMSSZ` for `time`, in UTC.
fn stamp(time: SystemTime) -> (String, String) {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let date = format!("{y:04}{m:02}{d:02}");
    let amz = format!(
        "{date}T{:02}{:02}{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    );
    (date, amz)
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn dates_are_written_in_utc() {
        let at = |secs| stamp(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0).1, "19700101T000000Z");
        assert_eq!(at(951_782_400).1, "20000229T000000Z");
        assert_eq!(at(1_796_456_328).1, "20261205T073848Z");
    }

    // Pins the signature against the one the official `aws-sigv4` crate
    // (1.6.6) computes for the same request, credentials and time.
    #[test]
    fn signs_as_the_official_crate_does() {
        let credentials = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            Some("session-token-example".to_owned()),
        );
        let time = UNIX_EPOCH + Duration::from_secs(1_796_456_328);
        let body = br#"{"TableName":"idem","Key":{"pk":{"S":"k"}},"ConsistentRead":true}"#;
        let signed = sign(
            &credentials,
            "eu-west-1",
            "dynamodb.eu-west-1.amazonaws.com",
            "DynamoDB_20120810.GetItem",
            body,
            time,
        );
        assert_eq!(signed.amz_date, "20261205T073848Z");
        assert_eq!(signed.authorization, KNOWN_AUTHORIZATION);
    }

    const KNOWN_AUTHORIZATION: &str = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261205/eu-west-1/dynamodb/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-amz-target, Signature=dcd253a2a77d88e90bbc1c28db4802bf1bb4c526fa57b146194e45507c7eba5a";
}
