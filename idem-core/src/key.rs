//! Idempotency keys and their unambiguous storage encoding.

use std::fmt;

/// Why a key was refused. The work never runs for a refused key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The client key is empty.
    #[error("the idempotency key is empty; send 1 to 255 visible ASCII characters")]
    Empty,
    /// The client key is longer than [`Key::MAX_CLIENT_KEY_LEN`].
    #[error("the idempotency key is {len} bytes long; at most 255 are allowed")]
    TooLong {
        /// The length that was sent, in bytes.
        len: usize,
    },
    /// The client key holds a byte outside visible ASCII (0x21–0x7E).
    #[error("the idempotency key has byte 0x{byte:02x} at offset {offset}; only visible ASCII (0x21-0x7E) is allowed")]
    InvalidByte {
        /// The offending byte.
        byte: u8,
        /// Its offset in the key.
        offset: usize,
    },
    /// The namespace or scope is too long or holds a control character.
    #[error("the {part} is not usable: {reason}")]
    InvalidScope {
        /// `"namespace"` or `"scope"`.
        part: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// A part of a [`Key`] besides the client key, named by
/// [`KeyError::part`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyPart {
    /// The namespace: set by the application, so a refused one is a
    /// configuration error, not the client's.
    Namespace,
    /// The scope: the tenant or principal.
    Scope,
}

impl KeyPart {
    /// `"namespace"` or `"scope"`, as in [`KeyError::InvalidScope`]'s
    /// `part`.
    pub const fn as_str(self) -> &'static str {
        match self {
            KeyPart::Namespace => "namespace",
            KeyPart::Scope => "scope",
        }
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl KeyError {
    /// Which part was refused, for [`KeyError::InvalidScope`]; `None` for
    /// errors about the client key. Match on this rather than on the
    /// `part` string.
    pub fn part(&self) -> Option<KeyPart> {
        match self {
            KeyError::InvalidScope { part, .. } if *part == KeyPart::Namespace.as_str() => {
                Some(KeyPart::Namespace)
            }
            KeyError::InvalidScope { .. } => Some(KeyPart::Scope),
            _ => None,
        }
    }
}

/// An idempotency key: namespace, scope and client key, encoded once.
///
/// The client key is what the caller sends (1–255 visible ASCII
/// characters). The scope is the tenant or principal that owns it (`""`
/// when there is none) and the namespace separates applications sharing a
/// store. The storage form length-prefixes namespace and scope, so scope
/// `a:b` with key `c` can never collide with scope `a` with key `b:c`.
/// A [`Store`](crate::store::Store) only ever sees [`Key::as_str`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    encoded: String,
    client_start: usize,
}

impl Key {
    /// The longest client key, in characters.
    pub const MAX_CLIENT_KEY_LEN: usize = 255;

    /// The longest namespace or scope, in bytes.
    pub const MAX_SCOPE_LEN: usize = 255;

    /// Validates the three parts and encodes them.
    pub fn new(namespace: &str, scope: &str, client_key: &str) -> Result<Key, KeyError> {
        Key::validate_client_key(client_key)?;
        validate_part(KeyPart::Namespace, namespace)?;
        validate_part(KeyPart::Scope, scope)?;
        // `{len}:{namespace}{len}:{scope}{client key}`, written without the
        // formatting machinery: this runs on every call.
        let mut encoded =
            String::with_capacity(namespace.len() + scope.len() + client_key.len() + 8);
        for part in [namespace, scope] {
            push_decimal(&mut encoded, part.len());
            encoded.push(':');
            encoded.push_str(part);
        }
        let client_start = encoded.len();
        encoded.push_str(client_key);
        Ok(Key {
            encoded,
            client_start,
        })
    }

    /// The storage form a store keeps records under.
    pub fn as_str(&self) -> &str {
        &self.encoded
    }

    /// The client key as it was sent.
    pub fn client_key(&self) -> &str {
        &self.encoded[self.client_start..]
    }

    /// Checks a client key against the rules: 1–255 bytes of visible ASCII.
    pub fn validate_client_key(key: &str) -> Result<(), KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > Key::MAX_CLIENT_KEY_LEN {
            return Err(KeyError::TooLong { len: key.len() });
        }
        match key.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
            Some(offset) => Err(KeyError::InvalidByte {
                byte: key.as_bytes()[offset],
                offset,
            }),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Key").field(&self.encoded).finish()
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encoded)
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

fn validate_part(part: KeyPart, value: &str) -> Result<(), KeyError> {
    let part = part.as_str();
    if value.len() > Key::MAX_SCOPE_LEN {
        return Err(KeyError::InvalidScope {
            part,
            reason: "longer than 255 bytes",
        });
    }
    // Control characters (NUL above all) cannot be kept by every store.
    if value.chars().any(char::is_control) {
        return Err(KeyError::InvalidScope {
            part,
            reason: "holds a control character",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_keeps_parts_apart() {
        let a = Key::new("ns", "a:b", "c").unwrap();
        let b = Key::new("ns", "a", "b:c").unwrap();
        assert_ne!(a.as_str(), b.as_str());
        assert_eq!(a.client_key(), "c");
        assert_eq!(b.client_key(), "b:c");
    }

    /// Records are stored under this form: it must not change, or keys
    /// written by an earlier build would no longer be found.
    #[test]
    fn the_storage_form_is_lengths_then_parts() {
        assert_eq!(Key::new("", "", "k").unwrap().as_str(), "0:0:k");
        assert_eq!(
            Key::new("shop", "tenant-7", "order:1").unwrap().as_str(),
            "4:shop8:tenant-7order:1"
        );
        for len in [9, 10, 99, 100, 255] {
            let part = "n".repeat(len);
            let key = Key::new(&part, "s", "k").unwrap();
            assert_eq!(key.as_str(), format!("{len}:{part}1:sk"));
            assert_eq!(key.client_key(), "k");
        }
    }

    #[test]
    fn bounds_are_enforced() {
        assert_eq!(Key::validate_client_key(""), Err(KeyError::Empty));
        assert!(Key::validate_client_key(&"k".repeat(255)).is_ok());
        assert_eq!(
            Key::validate_client_key(&"k".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert!(matches!(
            Key::validate_client_key("a b"),
            Err(KeyError::InvalidByte {
                byte: b' ',
                offset: 1
            })
        ));
        assert!(Key::validate_client_key("clé").is_err());
        assert!(Key::validate_client_key("a\tb").is_err());
        assert_eq!(
            Key::new("", "tenant\0", "k").unwrap_err().part(),
            Some(KeyPart::Scope)
        );
        assert_eq!(
            Key::new("ns\n", "", "k").unwrap_err().part(),
            Some(KeyPart::Namespace)
        );
        assert_eq!(Key::new("", "", "").unwrap_err().part(), None);
    }
}
