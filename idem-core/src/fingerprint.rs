//! Fingerprints: SHA-256 of what a request means, under a numbered scheme.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::ParseError;

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
    pub fn also_matching(self, older: Fingerprint) -> Fingerprints {
        Fingerprints::new(self).or(older)
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

/// [`Fingerprint::of_parts`] a part at a time, so that fingerprints whose
/// parts begin alike can share the hashing of what they share: clone it
/// after the common parts and finish each clone with its own.
///
/// ```
/// use idem_core::{Fingerprint, PartsHasher};
///
/// let mut request = PartsHasher::new();
/// request.update(b"POST");
/// request.update(b"/payments");
/// let mut with_body = request.clone();
/// with_body.update(b"{}");
/// assert_eq!(with_body.finish(), Fingerprint::of_parts([&b"POST"[..], b"/payments", b"{}"]));
/// ```
#[derive(Clone, Default)]
pub struct PartsHasher {
    hasher: Sha256,
    parts: u64,
}

impl PartsHasher {
    /// A hasher that has seen no part yet.
    pub fn new() -> PartsHasher {
        PartsHasher::default()
    }

    /// Adds the next part, prefixed by its length.
    pub fn update(&mut self, part: &[u8]) {
        self.hasher.update((part.len() as u64).to_be_bytes());
        self.hasher.update(part);
        self.parts += 1;
    }

    /// The fingerprint of the parts so far, scheme 1.
    pub fn finish(self) -> Fingerprint {
        Fingerprint::from_bytes(self.hasher.finalize().into())
    }
}

impl fmt::Debug for PartsHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartsHasher")
            .field("parts", &self.parts)
            .finish_non_exhaustive()
    }
}

/// A request's fingerprint, and the fingerprints of the same request under
/// older schemes, which a record made under one of those still matches.
/// New records get the [`current`](Fingerprints::current) one.
///
/// Built from one [`Fingerprint`] (`.into()`), or with
/// [`Fingerprint::also_matching`]. An older fingerprint that costs
/// something to compute can be given as a function
/// ([`or_lazily`](Fingerprints::or_lazily)): it runs only when a record of
/// its scheme is found, at most once however often the fingerprints are
/// cloned or compared. Most hits find a record of the current scheme, and
/// a first execution finds none, so neither pays for it.
#[derive(Clone)]
pub struct Fingerprints {
    current: Fingerprint,
    older: Vec<Older>,
}

/// An older scheme's fingerprint, as given or still to be computed.
#[derive(Clone)]
enum Older {
    Given(Fingerprint),
    Lazy {
        scheme: u8,
        value: Arc<dyn Deref<Target = Fingerprint> + Send + Sync>,
    },
}

impl Older {
    fn scheme(&self) -> u8 {
        match self {
            Older::Given(fingerprint) => fingerprint.scheme(),
            Older::Lazy { scheme, .. } => *scheme,
        }
    }

    fn value(&self) -> Fingerprint {
        match self {
            Older::Given(fingerprint) => *fingerprint,
            Older::Lazy { value, .. } => ***value,
        }
    }
}

impl fmt::Debug for Older {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Older::Given(fingerprint) => fingerprint.fmt(f),
            // Printing must not run the computation it stands for.
            Older::Lazy { scheme, .. } => write!(f, "Fingerprint(s{scheme}: computed when needed)"),
        }
    }
}

impl fmt::Debug for Fingerprints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fingerprints")
            .field("current", &self.current)
            .field("older", &self.older)
            .finish()
    }
}

/// Equal when they hold the same fingerprints in the same order; comparing
/// computes the lazy ones.
impl PartialEq for Fingerprints {
    fn eq(&self, other: &Fingerprints) -> bool {
        self.current == other.current
            && self.older.len() == other.older.len()
            && self
                .older
                .iter()
                .zip(&other.older)
                .all(|(a, b)| a.scheme() == b.scheme() && a.value() == b.value())
    }
}

impl Eq for Fingerprints {}

impl Fingerprints {
    /// Just `current`.
    pub fn new(current: Fingerprint) -> Fingerprints {
        Fingerprints {
            current,
            older: Vec::new(),
        }
    }

    /// Also accepts a record made under `older`'s scheme when its digest is
    /// `older`'s. A second fingerprint of a scheme already held replaces
    /// nothing: the first one of each scheme decides.
    pub fn or(mut self, older: Fingerprint) -> Fingerprints {
        self.older.push(Older::Given(older));
        self
    }

    /// Also accepts a record made under `scheme` whose digest is what
    /// `compute` returns, calling it only when such a record is found (see
    /// [`or`](Fingerprints::or) for the order of schemes). `compute` runs
    /// at most once, shared by every clone; its fingerprint is taken under
    /// `scheme` whatever scheme it was made with (0 is raised to 1).
    pub fn or_lazily<F>(mut self, scheme: u8, compute: F) -> Fingerprints
    where
        F: FnOnce() -> Fingerprint + Send + 'static,
    {
        let scheme = scheme.max(Fingerprint::FIRST_SCHEME);
        let value = LazyLock::new(move || compute().with_scheme(scheme));
        self.older.push(Older::Lazy {
            scheme,
            value: Arc::new(value),
        });
        self
    }

    /// The fingerprint new records are written with.
    pub fn current(&self) -> Fingerprint {
        self.current
    }

    /// The fingerprint this request has under `scheme`, if it carries one.
    /// An older one given with [`or_lazily`](Fingerprints::or_lazily) is
    /// computed now if it has not been yet.
    pub fn in_scheme(&self, scheme: u8) -> Option<Fingerprint> {
        if self.current.scheme() == scheme {
            return Some(self.current);
        }
        self.older
            .iter()
            .find(|older| older.scheme() == scheme)
            .map(Older::value)
    }

    /// Whether a record made with `stored` belongs to this request: the
    /// request's fingerprint of the record's scheme is the record's. A
    /// record of a scheme the request does not carry never matches.
    pub fn matches(&self, stored: &Fingerprint) -> bool {
        self.in_scheme(stored.scheme()) == Some(*stored)
    }
}

impl From<Fingerprint> for Fingerprints {
    fn from(current: Fingerprint) -> Fingerprints {
        Fingerprints::new(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_length_prefixed() {
        let a = Fingerprint::of_parts([&b"ab"[..], b"c"]);
        let b = Fingerprint::of_parts([&b"a"[..], b"bc"]);
        assert_ne!(a, b);
    }

    /// Pins the stored form of scheme 1: it is what every record written
    /// before schemes existed holds, byte for byte.
    #[test]
    fn scheme_one_is_stored_as_the_bare_digest() {
        let f = Fingerprint::of_bytes(b"body");
        assert_eq!(f.scheme(), 1);
        assert_eq!(f.stored(), &f.as_bytes()[..]);
        assert_eq!(Fingerprint::try_from(f.stored()), Ok(f));
        assert_eq!(Fingerprint::from_bytes(*f.as_bytes()), f);
    }

    #[test]
    fn later_schemes_are_stored_with_their_number() {
        let f = Fingerprint::of_bytes(b"body").with_scheme(2);
        assert_eq!(f.scheme(), 2);
        assert_eq!(f.stored().len(), 33);
        assert_eq!(f.stored()[0], 2);
        assert_eq!(Fingerprint::try_from(f.stored()), Ok(f));
        assert_ne!(f, Fingerprint::of_bytes(b"body"), "the scheme is compared");
        assert!(f.to_string().starts_with("s2:"));
        assert_eq!(Fingerprint::from_digest(0, [1; 32]).scheme(), 1);
    }

    #[test]
    fn bad_stored_forms_are_typed_errors() {
        assert_eq!(
            Fingerprint::try_from(&[0u8; 31][..]),
            Err(ParseError::FingerprintLength(31))
        );
        assert_eq!(
            Fingerprint::try_from(&[0u8; 34][..]),
            Err(ParseError::FingerprintLength(34))
        );
        assert_eq!(
            Fingerprint::try_from(&[0u8; 33][..]),
            Err(ParseError::FingerprintScheme(0))
        );
    }

    #[test]
    fn a_record_is_matched_in_its_own_scheme() {
        let raw = Fingerprint::of_bytes(b"{\"b\":1, \"a\":2}");
        let canonical = Fingerprint::of_bytes(b"{\"a\":2,\"b\":1}").with_scheme(2);
        let request = canonical.also_matching(raw);
        assert_eq!(request.current(), canonical);
        assert!(request.matches(&raw), "an old record still matches");
        assert!(request.matches(&canonical));
        assert!(!request.matches(&Fingerprint::of_bytes(b"other")));
        assert!(
            !request.matches(&raw.with_scheme(3)),
            "a scheme the request does not carry never matches"
        );
        assert!(!Fingerprints::from(canonical).matches(&raw));
    }

    #[test]
    fn a_lazy_older_fingerprint_is_computed_once_and_only_for_its_scheme() {
        use std::sync::atomic::{AtomicU32, Ordering};

        let raw = Fingerprint::of_bytes(b"{\"b\":1, \"a\":2}");
        let canonical = Fingerprint::of_bytes(b"{\"a\":2,\"b\":1}").with_scheme(2);
        let calls = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        let request = Fingerprints::new(canonical).or_lazily(1, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            raw
        });
        let copy = request.clone();
        assert!(format!("{request:?}").contains("computed when needed"));
        assert!(request.matches(&canonical));
        assert!(!request.matches(&raw.with_scheme(3)));
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no scheme-1 record yet");
        assert!(request.matches(&raw), "an old record still matches");
        assert!(copy.matches(&raw));
        assert!(!copy.matches(&Fingerprint::of_bytes(b"other")));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "computed once, shared by clones"
        );
        assert_eq!(request, canonical.also_matching(raw));
        assert_ne!(
            request,
            canonical.also_matching(Fingerprint::of_bytes(b"other"))
        );
    }

    #[test]
    fn a_lazy_fingerprint_takes_the_scheme_it_was_given() {
        let made = Fingerprint::of_bytes(b"a").with_scheme(5);
        let request = Fingerprint::of_bytes(b"b")
            .with_scheme(2)
            .also_matching(Fingerprint::of_bytes(b"c").with_scheme(3))
            .or_lazily(0, move || made);
        assert_eq!(request.in_scheme(1), Some(Fingerprint::of_bytes(b"a")));
        assert_eq!(request.in_scheme(5), None);
        assert_eq!(
            request.in_scheme(3),
            Some(Fingerprint::of_bytes(b"c").with_scheme(3))
        );
    }

    #[test]
    fn parts_hashed_a_part_at_a_time_are_of_parts() {
        let mut shared = PartsHasher::new();
        shared.update(b"POST");
        shared.update(b"");
        let (mut a, mut b) = (shared.clone(), shared);
        a.update(b"x");
        b.update(b"yz");
        assert_eq!(a.finish(), Fingerprint::of_parts([&b"POST"[..], b"", b"x"]));
        assert_eq!(
            b.finish(),
            Fingerprint::of_parts([&b"POST"[..], b"", b"yz"])
        );
        assert_eq!(PartsHasher::new().finish(), Fingerprint::of_parts([]));
    }
}
