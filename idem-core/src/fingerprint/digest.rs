//! The fingerprint itself: a scheme number and a SHA-256 digest.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{MatchingFingerprints, PartsHasher};
use crate::store::ParseError;

/// A SHA-256 digest of a request, stored with its record and checked on
/// every hit: the same key with another fingerprint is a
/// [`Mismatch`](crate::Error::Mismatch).
///
/// # Schemes
///
/// A fingerprint carries the number of the *scheme* that made it: which
/// bytes of a request were hashed, and how. Every fingerprint written
/// before schemes existed — [`of_json`](Fingerprint::of_json),
/// [`of_bytes`](Fingerprint::of_bytes), [`of_parts`](Fingerprint::of_parts)
/// — is scheme [`1`](Fingerprint::FIRST_SCHEME), and they still make
/// scheme 1. A caller that changes what it hashes (the HTTP layer moving
/// from raw body bytes to canonical JSON, say) gives its new fingerprints a
/// new number with [`with_scheme`](Fingerprint::with_scheme) and, for as
/// long as records of the old scheme may live, sends the old fingerprint
/// too ([`also_matching`](Fingerprint::also_matching)): a record is matched
/// against the request's fingerprint *of the record's scheme*, so stored
/// keys keep replaying through the change instead of becoming mismatches.
/// Scheme numbers belong to whoever computes the fingerprint (one
/// application, one HTTP layer); the store only keeps them.
///
/// Two fingerprints are equal when both scheme and digest are. Stores keep
/// the [`stored`](Fingerprint::stored) form, which is the bare 32-byte
/// digest for scheme 1 (exactly what was stored before schemes existed,
/// so old records need no migration) and a scheme byte followed by the
/// digest for every later scheme; [`TryFrom<&[u8]>`](Fingerprint#impl-TryFrom<%26%5Bu8%5D>-for-Fingerprint)
/// reads either back.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// The scheme byte, then the digest.
    bytes: [u8; 33],
}

impl Fingerprint {
    /// The scheme of every fingerprint made before schemes existed, and of
    /// every one the constructors here make.
    pub const FIRST_SCHEME: u8 = 1;

    /// Hashes the canonical JSON form of `body`: object keys sorted at every
    /// depth, no whitespace. Field order and map iteration order never change
    /// the result. Scheme 1.
    ///
    /// Fails only when `body` cannot be represented as JSON (for example a
    /// map whose keys are not strings or numbers).
    ///
    /// Most bodies are written in their canonical form in one pass: compact
    /// JSON, with each object whose keys come out of order (a struct's
    /// fields, a `HashMap`) rewritten in key order as it closes. A body
    /// with a key that needs escaping or is not a string, a key written
    /// twice, an `f32`, a 128-bit integer or raw JSON goes through
    /// [`serde_json::Value`] instead. Both paths give the same bytes for the
    /// same body; only the time differs.
    pub fn of_json<T: Serialize + ?Sized>(body: &T) -> Result<Fingerprint, serde_json::Error> {
        crate::canonical::fingerprint(body)
    }

    /// Hashes raw bytes as they are. Scheme 1.
    pub fn of_bytes(bytes: &[u8]) -> Fingerprint {
        Fingerprint::from_bytes(Sha256::digest(bytes).into())
    }

    /// Hashes several parts, each prefixed by its length, so that no two
    /// different part lists share a fingerprint (`["ab", "c"]` differs from
    /// `["a", "bc"]`). The HTTP layer uses method, path and query, content
    /// type and body. Scheme 1.
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Fingerprint {
        let mut hasher = PartsHasher::new();
        for part in parts {
            hasher.update(part);
        }
        hasher.finish()
    }

    /// Wraps a scheme-1 digest, as stores read them back before schemes
    /// existed. Use [`TryFrom<&[u8]>`](Fingerprint#impl-TryFrom<%26%5Bu8%5D>-for-Fingerprint)
    /// to read a [`stored`](Fingerprint::stored) form of any scheme.
    pub const fn from_bytes(digest: [u8; 32]) -> Fingerprint {
        Fingerprint::from_digest(Fingerprint::FIRST_SCHEME, digest)
    }

    /// A digest made under `scheme`. Scheme 0 names no scheme and is
    /// raised to 1.
    pub const fn from_digest(scheme: u8, digest: [u8; 32]) -> Fingerprint {
        let mut bytes = [0; 33];
        bytes[0] = if scheme == 0 { 1 } else { scheme };
        let mut i = 0;
        while i < 32 {
            bytes[i + 1] = digest[i];
            i += 1;
        }
        Fingerprint { bytes }
    }

    /// The same digest under another scheme (0 is raised to 1): how a
    /// caller numbers the fingerprints of a new way of hashing requests.
    pub const fn with_scheme(self, scheme: u8) -> Fingerprint {
        Fingerprint::from_digest(scheme, *self.as_bytes())
    }

    /// The number of the scheme that made this fingerprint; 1 for every
    /// fingerprint made before schemes existed.
    pub const fn scheme(&self) -> u8 {
        self.bytes[0]
    }

    /// The 32 digest bytes, without the scheme.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        match self.bytes.last_chunk::<32>() {
            Some(digest) => digest,
            None => unreachable!(),
        }
    }

    /// The form a store keeps: the 32 digest bytes for scheme 1 (the form
    /// every record had before schemes existed), a scheme byte followed by
    /// them for any later scheme. Read back with
    /// [`TryFrom<&[u8]>`](Fingerprint#impl-TryFrom<%26%5Bu8%5D>-for-Fingerprint).
    pub fn stored(&self) -> &[u8] {
        if self.scheme() == Fingerprint::FIRST_SCHEME {
            &self.bytes[1..]
        } else {
            &self.bytes
        }
    }

    /// This fingerprint, accepting also a record made under an older
    /// scheme with `older`. See [Schemes](Fingerprint#schemes).
    pub fn also_matching(self, older: Fingerprint) -> MatchingFingerprints {
        MatchingFingerprints::new(self).or(older)
    }
}

impl TryFrom<&[u8]> for Fingerprint {
    type Error = ParseError;

    /// Reads a [`stored`](Fingerprint::stored) form: 32 bytes are a scheme-1
    /// digest, 33 a scheme byte (not 0) and a digest.
    fn try_from(stored: &[u8]) -> Result<Fingerprint, ParseError> {
        match (stored.len(), stored.first()) {
            (32, _) => {
                let mut digest = [0; 32];
                digest.copy_from_slice(stored);
                Ok(Fingerprint::from_bytes(digest))
            }
            (33, Some(0)) => Err(ParseError::FingerprintScheme(0)),
            (33, Some(&Fingerprint::FIRST_SCHEME)) => Err(ParseError::FirstSchemeWithByte),
            (33, Some(&scheme)) => {
                let mut digest = [0; 32];
                digest.copy_from_slice(&stored[1..]);
                Ok(Fingerprint::from_digest(scheme, digest))
            }
            (len, _) => Err(ParseError::FingerprintLength(len)),
        }
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// The digest in hex, preceded by `s<scheme>:` for any scheme after 1.
impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scheme() != Fingerprint::FIRST_SCHEME {
            write!(f, "s{}:", self.scheme())?;
        }
        self.as_bytes()
            .iter()
            .try_for_each(|b| write!(f, "{b:02x}"))
    }
}
