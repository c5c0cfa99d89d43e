//! A shared secret sent as a header, such as Telegram's
//! `X-Telegram-Bot-Api-Secret-Token`.

use http::header::HeaderName;
use http::HeaderMap;

use super::{constant_time_eq, SecretError, Secrets, Verified, Verifier, VerifyError};

/// A scheme where the provider sends a shared secret verbatim in a header.
///
/// The body is not signed, so this proves only that the sender knows the
/// secret; use it where the provider offers nothing better (Telegram's
/// `setWebhook` `secret_token`). The header is compared in constant time
/// against each configured secret.
///
/// A captured delivery gives away the secret itself, so it can be resent,
/// or any other body sent, at any time. The receiver dedupes on the event
/// id read from the body, which a verbatim resend repeats; it adds no body
/// digest, which would stop nothing a holder of the secret cannot forge
/// around (see the [module docs](super)).
#[derive(Debug, Clone)]
pub struct SecretHeader {
    header: HeaderName,
    name: &'static str,
    secrets: Secrets,
}

impl SecretHeader {
    /// Accepts deliveries whose `header` equals any of `secrets`.
    ///
    /// `header` is a static name such as `"x-telegram-bot-api-secret-token"`
    /// (lower case).
    pub fn new<I, S>(header: &'static str, secrets: I) -> Result<SecretHeader, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(SecretHeader {
            header: HeaderName::from_static(header),
            name: header,
            secrets: Secrets::raw(secrets)?,
        })
    }

    /// Telegram's `X-Telegram-Bot-Api-Secret-Token`.
    pub fn telegram<I, S>(secrets: I) -> Result<SecretHeader, SecretError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        SecretHeader::new("x-telegram-bot-api-secret-token", secrets)
    }

    /// The name of the header checked.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }
}

impl Verifier for SecretHeader {
    fn verify(&self, headers: &HeaderMap, _body: &[u8]) -> Result<Verified, VerifyError> {
        let mut values = headers.get_all(&self.header).iter();
        let value = values.next().ok_or(VerifyError::MissingHeader(self.name))?;
        if values.next().is_some() {
            return Err(VerifyError::DuplicateHeader(self.name));
        }
        let matched = self
            .secrets
            .iter()
            .fold(false, |any, s| any | constant_time_eq(s, value.as_bytes()));
        if !matched {
            return Err(VerifyError::SignatureMismatch);
        }
        Ok(Verified::default())
    }
}
