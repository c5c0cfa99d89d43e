//! Fingerprints of requests seen lately, found by their exact bytes, so
//! that a byte-identical retry is neither transcoded nor hashed again.
//!
//! A retry usually sends the very bytes it sent before. The request's
//! fingerprint is a pure function of its method, path and query,
//! `Content-Type` lines and body, so the one computed for those bytes
//! last time is the one they have now: a table of recent requests, keyed
//! by the bytes themselves (compared in full, never by a digest alone),
//! gives it back for the cost of a keyed hash and a comparison. A body
//! spelled differently misses and pays for its canonical form as before.
//!
//! Why not a digest of the body kept in the record beside the canonical
//! fingerprint: the claim writes the record's fingerprint before anyone
//! knows whether the key is new, so every request must bring its
//! canonical fingerprint to the claim; a digest in the record could only
//! be checked after the round trip that needs the fingerprint. The table
//! spares that work in the process the retry reaches, with no change to
//! records, so every record keeps replaying as it did.
//!
//! The table is direct-mapped ([`SLOTS`] slots, each behind its own lock,
//! a newer request taking an older one's slot) and keeps requests of up to
//! [`LONGEST`] bytes, so it never holds more than about a mebibyte.

use std::borrow::Cow;
use std::hash::{BuildHasher, Hasher};
use std::sync::{LazyLock, Mutex, PoisonError};

use idem_core::fingerprint::PartsHasher;
use idem_core::Fingerprint;

/// How many requests the table keeps.
pub(super) const SLOTS: usize = 1024;

/// The longest request (path, `Content-Type` and body together) it keeps.
pub(super) const LONGEST: usize = 1024;

/// What a request's bytes gave last time.
#[derive(Clone)]
pub(super) struct Known {
    /// The method, path and query, and `Content-Type`, hashed as the
    /// fingerprint hashes them, for the scheme-1 form computed lazily.
    pub(super) prefix: PartsHasher,
    /// The canonical digest of a JSON body, or `None` for a body hashed
    /// byte for byte (whose scheme-1 form is the same digest).
    pub(super) canonical: Option<Fingerprint>,
    /// The fingerprint of scheme 1 when the body is not JSON.
    pub(super) raw: Option<Fingerprint>,
}

struct Slot {
    request: Box<[u8]>,
    known: Known,
}

struct Table {
    /// Seeded at random per process; foldhash rather than the standard
    /// SipHash, which took a third of a replay's fingerprint. Two requests
    /// that share a slot cost each other only a miss.
    hasher: foldhash::fast::RandomState,
    slots: Box<[Mutex<Option<Slot>>]>,
}

static TABLE: LazyLock<Table> = LazyLock::new(|| Table {
    hasher: foldhash::fast::RandomState::default(),
    slots: (0..SLOTS).map(|_| Mutex::new(None)).collect(),
});

/// A request's bytes, as the table compares them: each part with its
/// length, so that no two requests share a spelling, and whether the
/// fingerprint read the body as JSON (which rests on the number of
/// `Content-Type` lines, not only on their joined value).
pub(super) struct Request<'a> {
    parts: [&'a [u8]; 5],
    len: usize,
}

impl<'a> Request<'a> {
    pub(super) fn new(
        method: &'a str,
        target: &'a str,
        content_type: &'a Cow<'a, [u8]>,
        json: bool,
        body: &'a [u8],
    ) -> Request<'a> {
        let json: &[u8] = if json { b"json" } else { b"bytes" };
        let parts = [
            method.as_bytes(),
            target.as_bytes(),
            &content_type[..],
            json,
            body,
        ];
        let len = parts.iter().map(|p| p.len() + 8).sum();
        Request { parts, len }
    }

    fn slot(&self) -> usize {
        let mut hasher = TABLE.hasher.build_hasher();
        for part in self.parts {
            hasher.write_usize(part.len());
            hasher.write(part);
        }
        (hasher.finish() as usize) % SLOTS
    }

    fn same_as(&self, kept: &[u8]) -> bool {
        if kept.len() != self.len {
            return false;
        }
        let mut rest = kept;
        for part in self.parts {
            let (len, tail) = rest.split_at(8);
            if len != (part.len() as u64).to_be_bytes() || !tail.starts_with(part) {
                return false;
            }
            rest = &tail[part.len()..];
        }
        true
    }

    fn to_bytes(&self) -> Box<[u8]> {
        let mut bytes = Vec::with_capacity(self.len);
        for part in self.parts {
            bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
            bytes.extend_from_slice(part);
        }
        bytes.into_boxed_slice()
    }
}

/// What these exact bytes gave last time, if the table still has them.
pub(super) fn recall(request: &Request<'_>) -> Option<Known> {
    if request.len > LONGEST {
        return None;
    }
    let slot = TABLE.slots[request.slot()]
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match &*slot {
        Some(kept) if request.same_as(&kept.request) => Some(kept.known.clone()),
        _ => None,
    }
}

/// Keeps what `request` gave, in place of whatever shared its slot.
pub(super) fn remember(request: &Request<'_>, known: Known) {
    if request.len > LONGEST {
        return;
    }
    let kept = Slot {
        request: request.to_bytes(),
        known,
    };
    *TABLE.slots[request.slot()]
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(kept);
}
