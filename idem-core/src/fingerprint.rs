//! Fingerprints: SHA-256 of what a request means.

use std::fmt;
use std::io;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A SHA-256 digest of a request, stored with its record and checked on
/// every hit: the same key with another fingerprint is a
/// [`Mismatch`](crate::Error::Mismatch).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Hashes the canonical JSON form of `body`: object keys sorted at every
    /// depth, no whitespace. Field order and map iteration order never change
    /// the result.
    ///
    /// Fails only when `body` cannot be represented as JSON (for example a
    /// map whose keys are not strings or numbers).
    pub fn of_json<T: Serialize + ?Sized>(body: &T) -> Result<Fingerprint, serde_json::Error> {
        let value = serde_json::to_value(body)?;
        let mut hasher = HashWriter(Sha256::new());
        write_canonical(&mut hasher, &value)?;
        Ok(Fingerprint(hasher.0.finalize().into()))
    }

    /// Hashes raw bytes as they are.
    pub fn of_bytes(bytes: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// Hashes several parts, each prefixed by its length, so that no two
    /// different part lists share a fingerprint (`["ab", "c"]` differs from
    /// `["a", "bc"]`). The HTTP layer uses method, path and query, content
    /// type and body.
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Fingerprint {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Fingerprint(hasher.finalize().into())
    }

    /// Wraps a digest read back from a store.
    pub const fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// The 32 digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

struct HashWriter(Sha256);

impl io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn write_canonical(out: &mut HashWriter, value: &Value) -> Result<(), serde_json::Error> {
    use io::Write;
    match value {
        Value::Array(items) => {
            out.0.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.0.update(b",");
                }
                write_canonical(out, item)?;
            }
            out.0.update(b"]");
        }
        Value::Object(map) => {
            // Sorted here rather than trusting the map type: serde_json's
            // `preserve_order` feature, enabled by any crate in a build,
            // would otherwise make the hash depend on insertion order.
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.0.update(b"{");
            for (i, (name, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.0.update(b",");
                }
                serde_json::to_writer(&mut *out, name)?;
                out.0.update(b":");
                write_canonical(out, item)?;
            }
            out.0.update(b"}");
        }
        scalar => {
            serde_json::to_writer(&mut *out, scalar)?;
            out.flush().map_err(serde_json::Error::io)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_order_does_not_matter() {
        let a = json!({"amount": 1250, "currency": "EUR", "meta": {"x": 1, "y": [1, 2]}});
        let b: Value =
            serde_json::from_str(r#"{"meta":{"y":[1,2],"x":1},"currency":"EUR","amount":1250}"#)
                .unwrap();
        assert_eq!(
            Fingerprint::of_json(&a).unwrap(),
            Fingerprint::of_json(&b).unwrap()
        );
    }

    #[test]
    fn different_values_differ() {
        let a = Fingerprint::of_json(&json!({"amount": 1250})).unwrap();
        let b = Fingerprint::of_json(&json!({"amount": 1251})).unwrap();
        let c = Fingerprint::of_json(&json!({"amount": "1250"})).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn parts_are_length_prefixed() {
        let a = Fingerprint::of_parts([&b"ab"[..], b"c"]);
        let b = Fingerprint::of_parts([&b"a"[..], b"bc"]);
        assert_ne!(a, b);
    }

    #[test]
    fn unrepresentable_body_is_an_error() {
        let mut map = std::collections::HashMap::new();
        map.insert((1, 2), 3);
        assert!(Fingerprint::of_json(&map).is_err());
    }
}
