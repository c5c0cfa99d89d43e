//! Idempotency keys and their unambiguous storage encoding.

use std::fmt;

/// The longest client key, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// The longest namespace or scope, in bytes.
pub const MAX_SCOPE_LEN: usize = 255;

/// Why a key was refused. The work never runs for a refused key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The client key is empty.
    #[error("the idempotency key is empty; send 1 to 255 visible ASCII characters")]
    Empty,
    /// The client key is longer than [`MAX_KEY_LEN`].
    #[error("the idempotency key is {len} bytes long; at most {MAX_KEY_LEN} are allowed")]
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
/// A [`Store`](crate::Store) only ever sees [`Key::as_str`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    encoded: String,
    client_start: usize,
}

impl Key {
    /// Validates the three parts and encodes them.
    pub fn new(namespace: &str, scope: &str, client_key: &str) -> Result<Key, KeyError> {
        validate_client_key(client_key)?;
        validate_part(KeyPart::Namespace, namespace)?;
        validate_part(KeyPart::Scope, scope)?;
        let mut encoded =
            String::with_capacity(namespace.len() + scope.len() + client_key.len() + 8);
        use fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(
            encoded,
            "{}:{namespace}{}:{scope}",
            namespace.len(),
            scope.len()
        );
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

/// Checks a client key against the rules: 1–255 bytes of visible ASCII.
pub fn validate_client_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
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

fn validate_part(part: KeyPart, value: &str) -> Result<(), KeyError> {
    let part = part.as_str();
    if value.len() > MAX_SCOPE_LEN {
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

    #[test]
    fn bounds_are_enforced() {
        assert_eq!(validate_client_key(""), Err(KeyError::Empty));
        assert!(validate_client_key(&"k".repeat(255)).is_ok());
        assert_eq!(
            validate_client_key(&"k".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert!(matches!(
            validate_client_key("a b"),
            Err(KeyError::InvalidByte {
                byte: b' ',
                offset: 1
            })
        ));
        assert!(validate_client_key("clé").is_err());
        assert!(validate_client_key("a\tb").is_err());
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
