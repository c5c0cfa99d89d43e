//! What adapters need beyond [`Fingerprint`]: hashing a request a part
//! at a time ([`PartsHasher`]) and matching records made under older
//! schemes ([`MatchingFingerprints`]).

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock};

use sha2::{Digest, Sha256};

pub(crate) mod digest;

use crate::Fingerprint;

/// [`Fingerprint::of_parts`] a part at a time, so that fingerprints whose
/// parts begin alike can share the hashing of what they share: clone it
/// after the common parts and finish each clone with its own.
///
/// ```
/// use idem_core::fingerprint::PartsHasher;
/// use idem_core::Fingerprint;
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
/// New records get the [`current`](MatchingFingerprints::current) one.
///
/// Built from one [`Fingerprint`] (`.into()`), or with
/// [`Fingerprint::also_matching`]. An older fingerprint that costs
/// something to compute can be given as a function
/// ([`or_lazily`](MatchingFingerprints::or_lazily)): it runs only when a record of
/// its scheme is found, at most once however often the fingerprints are
/// cloned or compared. Most hits find a record of the current scheme, and
/// a first execution finds none, so neither pays for it.
#[derive(Clone)]
pub struct MatchingFingerprints {
    current: Fingerprint,
    /// The first older fingerprint, kept inline: every JSON request carries
    /// one (its scheme-1 form, computed lazily), and a vector would cost it
    /// an allocation.
    first: Option<Older>,
    /// The older fingerprints after the first, in the order given.
    rest: Vec<Older>,
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

impl fmt::Debug for MatchingFingerprints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MatchingFingerprints")
            .field("current", &self.current)
            .field("older", &self.older().collect::<Vec<_>>())
            .finish()
    }
}

/// Equal when they hold the same fingerprints in the same order; comparing
/// computes the lazy ones.
impl PartialEq for MatchingFingerprints {
    fn eq(&self, other: &MatchingFingerprints) -> bool {
        self.current == other.current
            && self.older().count() == other.older().count()
            && self
                .older()
                .zip(other.older())
                .all(|(a, b)| a.scheme() == b.scheme() && a.value() == b.value())
    }
}

impl Eq for MatchingFingerprints {}

impl MatchingFingerprints {
    /// Just `current`.
    pub fn new(current: Fingerprint) -> MatchingFingerprints {
        MatchingFingerprints {
            current,
            first: None,
            rest: Vec::new(),
        }
    }

    /// The older fingerprints, in the order given.
    fn older(&self) -> impl Iterator<Item = &Older> {
        self.first.iter().chain(&self.rest)
    }

    fn push(&mut self, older: Older) {
        match self.first {
            None => self.first = Some(older),
            Some(_) => self.rest.push(older),
        }
    }

    /// Also accepts a record made under `older`'s scheme when its digest is
    /// `older`'s. A second fingerprint of a scheme already held replaces
    /// nothing: the first one of each scheme decides.
    pub fn or(mut self, older: Fingerprint) -> MatchingFingerprints {
        self.push(Older::Given(older));
        self
    }

    /// Also accepts a record made under `scheme` whose digest is what
    /// `compute` returns, calling it only when such a record is found (see
    /// [`or`](MatchingFingerprints::or) for the order of schemes). `compute` runs
    /// at most once, shared by every clone; its fingerprint is taken under
    /// `scheme` whatever scheme it was made with (0 is raised to 1).
    pub fn or_lazily<F>(mut self, scheme: u8, compute: F) -> MatchingFingerprints
    where
        F: FnOnce() -> Fingerprint + Send + 'static,
    {
        let scheme = scheme.max(Fingerprint::FIRST_SCHEME);
        let value = LazyLock::new(move || compute().with_scheme(scheme));
        self.push(Older::Lazy {
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
    /// An older one given with [`or_lazily`](MatchingFingerprints::or_lazily) is
    /// computed now if it has not been yet.
    pub fn in_scheme(&self, scheme: u8) -> Option<Fingerprint> {
        if self.current.scheme() == scheme {
            return Some(self.current);
        }
        self.older()
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

impl From<Fingerprint> for MatchingFingerprints {
    fn from(current: Fingerprint) -> MatchingFingerprints {
        MatchingFingerprints::new(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ParseError;

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
        assert!(!MatchingFingerprints::from(canonical).matches(&raw));
    }

    #[test]
    fn a_lazy_older_fingerprint_is_computed_once_and_only_for_its_scheme() {
        use std::sync::atomic::{AtomicU32, Ordering};

        let raw = Fingerprint::of_bytes(b"{\"b\":1, \"a\":2}");
        let canonical = Fingerprint::of_bytes(b"{\"a\":2,\"b\":1}").with_scheme(2);
        let calls = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        let request = MatchingFingerprints::new(canonical).or_lazily(1, move || {
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
