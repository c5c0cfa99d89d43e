//! The idempotency key a request carries, and how it is written in a header.

use std::fmt;

use http::HeaderValue;
use idem_core::{Key, KeyError};

/// The key of one logical request: the same on every retry of it.
///
/// It holds 1–255 visible ASCII characters (0x21–0x7E), the rule every idem
/// server and the IETF `Idempotency-Key` draft's recommendation agree on, so
/// a key refused here would be refused by the server too.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// A fresh random key, a UUID v4: what a new intent gets by default.
    pub fn random() -> IdempotencyKey {
        IdempotencyKey(uuid::Uuid::new_v4().to_string())
    }

    /// A key chosen by the caller, such as an order id or a key derived
    /// from the intent (`idem_core`'s derived keys), validated.
    pub fn new(key: impl Into<String>) -> Result<IdempotencyKey, KeyError> {
        let key = key.into();
        Key::validate_client_key(&key)?;
        Ok(IdempotencyKey(key))
    }

    /// The key itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The header value in `format`.
    pub fn to_header_value(
        &self,
        format: KeyFormat,
    ) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
        match format {
            KeyFormat::SfString => {
                let mut quoted = String::with_capacity(self.0.len() + 2);
                quoted.push('"');
                for c in self.0.chars() {
                    if c == '"' || c == '\\' {
                        quoted.push('\\');
                    }
                    quoted.push(c);
                }
                quoted.push('"');
                HeaderValue::from_str(&quoted)
            }
            KeyFormat::Bare => HeaderValue::from_str(&self.0),
        }
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.0).finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the key is written in its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyFormat {
    /// The IETF draft's form, a structured-field string:
    /// `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`.
    #[default]
    SfString,
    /// The key as a bare value, for APIs that read the header verbatim
    /// (Stripe's `Idempotency-Key`, most custom headers).
    Bare,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_keys_are_uuids_and_differ() {
        let (a, b) = (IdempotencyKey::random(), IdempotencyKey::random());
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 36);
        assert_eq!(a.as_str().as_bytes()[14], b'4', "UUID version 4: {a}");
    }

    #[test]
    fn keys_outside_visible_ascii_are_refused() {
        assert_eq!(IdempotencyKey::new(""), Err(KeyError::Empty));
        assert!(IdempotencyKey::new("has space").is_err());
        assert!(IdempotencyKey::new("é").is_err());
        assert!(IdempotencyKey::new("x".repeat(256)).is_err());
        assert!(IdempotencyKey::new("x".repeat(255)).is_ok());
    }

    #[test]
    fn the_draft_form_quotes_and_escapes() {
        let key = IdempotencyKey::new(r#"a"b\c"#).unwrap();
        assert_eq!(
            key.to_header_value(KeyFormat::SfString).unwrap(),
            r#""a\"b\\c""#
        );
        assert_eq!(key.to_header_value(KeyFormat::Bare).unwrap(), r#"a"b\c"#);
    }
}
