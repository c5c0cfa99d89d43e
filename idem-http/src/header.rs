//! The `Idempotency-Key` header: one key, as the draft's sf-string or a
//! bare value.

use std::fmt;

use http::header::{HeaderMap, HeaderName};
use idem_core::{Key, KeyError};

/// Why the key header was refused; every one is answered with a 400
/// [`Problem::InvalidKey`](crate::Problem::InvalidKey).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// More than one header line, or a list in one line.
    Several,
    /// A structured-field parameter after the value.
    Parameters,
    /// A quoted string that is not well formed.
    BadQuoting,
    /// The value breaks the key rules.
    Key(KeyError),
}

impl KeyHeaderError {
    /// What to tell the client, naming the header it sent.
    pub fn detail(&self, header: &HeaderName) -> String {
        match self {
            KeyHeaderError::Several => {
                format!("send exactly one `{header}` value, not a list or several header lines")
            }
            KeyHeaderError::Parameters => {
                format!("the `{header}` value must not carry parameters (`;name=value`)")
            }
            KeyHeaderError::BadQuoting => format!(
                "the `{header}` value starts with a quote but is not a well-formed quoted string"
            ),
            KeyHeaderError::Key(error) => error.to_string(),
        }
    }
}

/// Reads the one idempotency key from `headers`: `Ok(None)` when the header
/// is absent.
///
/// Accepts the draft's structured-field string (`"abc"`, with `\"` and `\\`
/// escapes) and a bare value (`abc`). A bare value may not hold `"`, `,` or
/// `;`, since those would make it a list or carry parameters; quote the key
/// to send those characters. Firefox, with `network.http.idempotencyKey.enabled`,
/// adds a key of its own to a POST or PATCH that has none: a 64-bit unsigned
/// integer in decimal, quoted (`"9007199254740993"`), which reads as the key
/// `9007199254740993`.
pub fn client_key(
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Option<String>, KeyHeaderError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyHeaderError::Several);
    }
    key_of_value(value.as_bytes().trim_ascii()).map(Some)
}

/// The key one header value names.
fn key_of_value(raw: &[u8]) -> Result<String, KeyHeaderError> {
    // The common key, a token of visible ASCII with nothing to unquote or
    // refuse, is taken in one pass; anything else goes the long way, which
    // decides what is wrong with it.
    if (1..=Key::MAX_CLIENT_KEY_LEN).contains(&raw.len())
        && raw
            .iter()
            .all(|&b| (0x21..=0x7e).contains(&b) && !matches!(b, b'"' | b',' | b';'))
    {
        if let Ok(key) = std::str::from_utf8(raw) {
            return Ok(key.to_owned());
        }
    }
    key_the_long_way(raw)
}

fn key_the_long_way(raw: &[u8]) -> Result<String, KeyHeaderError> {
    let key = match raw.first() {
        Some(b'"') => unquote(raw)?,
        _ => {
            if raw.contains(&b',') {
                return Err(KeyHeaderError::Several);
            }
            if raw.contains(&b';') {
                return Err(KeyHeaderError::Parameters);
            }
            if raw.contains(&b'"') {
                return Err(KeyHeaderError::BadQuoting);
            }
            bytes_to_key(raw)?
        }
    };
    Key::validate_client_key(&key).map_err(KeyHeaderError::Key)?;
    Ok(key)
}

/// Parses an sf-string (RFC 8941 §3.3.3) that must make up the whole value.
fn unquote(raw: &[u8]) -> Result<String, KeyHeaderError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw[1..].iter();
    loop {
        match rest.next() {
            None => return Err(KeyHeaderError::BadQuoting),
            Some(b'\\') => match rest.next() {
                Some(&escaped @ (b'"' | b'\\')) => out.push(escaped),
                _ => return Err(KeyHeaderError::BadQuoting),
            },
            Some(b'"') => break,
            // Bytes outside visible ASCII are kept for the key rule to name.
            Some(&byte) => out.push(byte),
        }
    }
    match rest.as_slice().trim_ascii_start().first() {
        None => bytes_to_key(&out),
        Some(b';') => Err(KeyHeaderError::Parameters),
        Some(b',') => Err(KeyHeaderError::Several),
        Some(_) => Err(KeyHeaderError::BadQuoting),
    }
}

fn bytes_to_key(bytes: &[u8]) -> Result<String, KeyHeaderError> {
    match std::str::from_utf8(bytes) {
        Ok(key) => Ok(key.to_owned()),
        Err(_) => {
            // Report the first byte the key rule refuses, as the rule would.
            let offset = bytes
                .iter()
                .position(|b| !(0x21..=0x7e).contains(b))
                .unwrap_or(0);
            Err(KeyHeaderError::Key(KeyError::InvalidByte {
                byte: bytes.get(offset).copied().unwrap_or(0),
                offset,
            }))
        }
    }
}

impl fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail(&HeaderName::from_static("idempotency-key")))
    }
}

impl std::error::Error for KeyHeaderError {}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// The one-pass reading gives what the long way gives, for every value
    /// of up to three bytes from an alphabet of the bytes that decide (and
    /// for keys at and over the length limit).
    #[test]
    fn the_quick_reading_agrees_with_the_long_way() {
        let alphabet: &[u8] = b"a~ \t\"\\,;\x7f\x80\x00!";
        let mut values: Vec<Vec<u8>> = vec![Vec::new()];
        for len in 1..=3 {
            let mut value = vec![0usize; len];
            loop {
                values.push(value.iter().map(|&i| alphabet[i]).collect());
                let Some(at) = value.iter().rposition(|&i| i + 1 < alphabet.len()) else {
                    break;
                };
                value[at] += 1;
                value[at + 1..].iter_mut().for_each(|i| *i = 0);
            }
        }
        values.push(vec![b'k'; Key::MAX_CLIENT_KEY_LEN]);
        values.push(vec![b'k'; Key::MAX_CLIENT_KEY_LEN + 1]);
        for value in &values {
            let quick = key_of_value(value);
            let long = key_the_long_way(value);
            assert_eq!(format!("{quick:?}"), format!("{long:?}"), "{value:?}");
        }
        assert!(values.len() > 1_000);
    }

    fn key_of(values: &[&[u8]]) -> Result<Option<String>, KeyHeaderError> {
        let name = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(&name, HeaderValue::from_bytes(value).unwrap());
        }
        client_key(&headers, &name)
    }

    #[test]
    fn quoted_and_bare_keys_read_the_same() {
        assert_eq!(key_of(&[b"abc"]), Ok(Some("abc".into())));
        assert_eq!(key_of(&[b"\"abc\""]), Ok(Some("abc".into())));
        assert_eq!(key_of(&[b"  \"abc\"  "]), Ok(Some("abc".into())));
        assert_eq!(key_of(&[br#""a\"b\\c""#]), Ok(Some(r#"a"b\c"#.into())));
        assert_eq!(key_of(&[b"\"a;b,c\""]), Ok(Some("a;b,c".into())));
        assert_eq!(key_of(&[]), Ok(None));
    }

    #[test]
    fn keys_firefox_generates_are_accepted() {
        // Firefox (`network.http.idempotencyKey.enabled`) adds a key of its
        // own to a POST or PATCH that has none: a 64-bit unsigned integer in
        // decimal, sent as an sf-string.
        assert_eq!(
            key_of(&[b"\"18446744073709551615\""]),
            Ok(Some("18446744073709551615".into()))
        );
        assert_eq!(key_of(&[b"\"0\""]), Ok(Some("0".into())));
        assert_eq!(
            key_of(&[b"\"9007199254740993\""]),
            key_of(&[b"9007199254740993"])
        );
    }

    #[test]
    fn malformed_values_are_refused_with_their_reason() {
        assert_eq!(key_of(&[b"a", b"b"]), Err(KeyHeaderError::Several));
        assert_eq!(key_of(&[b"a, b"]), Err(KeyHeaderError::Several));
        assert_eq!(key_of(&[b"\"a\", \"b\""]), Err(KeyHeaderError::Several));
        assert_eq!(key_of(&[b"\"a\";p=1"]), Err(KeyHeaderError::Parameters));
        assert_eq!(key_of(&[b"a;p=1"]), Err(KeyHeaderError::Parameters));
        assert_eq!(key_of(&[b"\"abc"]), Err(KeyHeaderError::BadQuoting));
        assert_eq!(key_of(&[b"\"a\\x\""]), Err(KeyHeaderError::BadQuoting));
        assert_eq!(key_of(&[b"\"a\"b"]), Err(KeyHeaderError::BadQuoting));
        assert_eq!(key_of(&[b"ab\"c"]), Err(KeyHeaderError::BadQuoting));
        assert_eq!(key_of(&[b""]), Err(KeyHeaderError::Key(KeyError::Empty)));
        assert_eq!(
            key_of(&[b"\"\""]),
            Err(KeyHeaderError::Key(KeyError::Empty))
        );
        assert!(matches!(
            key_of(&[b"\"a b\""]),
            Err(KeyHeaderError::Key(KeyError::InvalidByte {
                byte: b' ',
                ..
            }))
        ));
        assert!(matches!(
            key_of(&[b"cl\xc3\xa9"]),
            Err(KeyHeaderError::Key(KeyError::InvalidByte { .. }))
        ));
        assert!(matches!(
            key_of(&[b"caf\xe9"]),
            Err(KeyHeaderError::Key(KeyError::InvalidByte {
                byte: 0xe9,
                offset: 3
            }))
        ));
        let long = vec![b'k'; 256];
        assert_eq!(
            key_of(&[&long]),
            Err(KeyHeaderError::Key(KeyError::TooLong { len: 256 }))
        );
        assert_eq!(key_of(&[&long[..255]]), Ok(Some("k".repeat(255))));
    }
}
