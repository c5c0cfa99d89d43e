//! Looking inside a store: the optional reads behind the `idem` command.

use async_trait::async_trait;

use crate::store::{Record, State, Store, StoreError};

/// The most records one [`Inspect::list`] call returns.
pub const MAX_PAGE: usize = 1000;

/// Which records [`Inspect::list`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Listing {
    /// Live `InFlight` records: keys held by a lease now, or whose owner's
    /// lease lapsed and nobody took them over yet.
    InFlight,
    /// Live `Failed` records: remembered failures.
    Failed,
}

impl Listing {
    /// The state this listing selects.
    pub const fn state(self) -> State {
        match self {
            Listing::InFlight => State::InFlight,
            Listing::Failed => State::Failed,
        }
    }
}

/// One record found by [`Inspect::list`], with the key it is stored under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The stored key ([`Key::as_str`](crate::Key::as_str)); split it with
    /// [`KeyParts::parse`].
    pub key: String,
    /// The record, decoded as the store's own methods decode it.
    pub record: Record,
}

/// A page of [`Inspect::list`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// The records on this page, at most the limit asked for.
    pub records: Vec<Listed>,
    /// Where the next page starts (pass it as `after`); `None` on the last
    /// page. Opaque: a stored key for SQL stores, a scan cursor for Redis.
    pub next: Option<String>,
}

/// How many records a store holds, by state. Counts live records, except
/// [`Stats::expired`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// `InFlight` records whose lease is live.
    pub in_flight: u64,
    /// `InFlight` records whose lease lapsed: a crashed owner's, waiting
    /// for a takeover.
    pub lapsed: u64,
    /// `Completed` records.
    pub completed: u64,
    /// `Failed` records.
    pub failed: u64,
    /// Records past retention that a purge has not deleted yet (always 0
    /// for a store that expires records itself).
    pub expired: u64,
}

impl Stats {
    /// Counts one live record.
    pub fn add(&mut self, record: &Record) {
        match record.state {
            State::InFlight if record.lease_lapsed() => self.lapsed += 1,
            State::InFlight => self.in_flight += 1,
            State::Completed => self.completed += 1,
            State::Failed => self.failed += 1,
        }
    }
}

/// Reads across many records, for operators: listing and counting. Not
/// part of [`Store`], whose methods all act on one key; a store that can
/// list its records implements this too, in its own crate, decoding rows
/// with the same code its `Store` methods use.
///
/// # Contract
///
/// Both methods only read. `list` MUST return only live records of the
/// listed state, at most `limit` (clamped to 1..=[`MAX_PAGE`]) of them
/// (a store that pages with a server-side scan, as Redis does, MAY return
/// a scan's worth more, and says so), and a `next` that continues after
/// them; following `next` until it is
/// `None` MUST visit every record that stayed live and in that state
/// throughout, at least once. A page MAY hold fewer than `limit` records
/// while `next` is `Some`. `stats` counts every record once; on a busy
/// store the counts are a moment's, not a snapshot's.
#[async_trait]
pub trait Inspect: Store {
    /// A page of the records in `listing`'s state, starting after `after`
    /// (the `next` of the page before; `None` for the first page).
    async fn list(
        &self,
        listing: Listing,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError>;

    /// Counts the records by state.
    async fn stats(&self) -> Result<Stats, StoreError>;
}

/// A page size as [`Inspect::list`] uses it: 1 to [`MAX_PAGE`].
pub fn page_limit(limit: usize) -> usize {
    limit.clamp(1, MAX_PAGE)
}

/// The three parts of a stored key, read back from
/// [`Key::as_str`](crate::Key::as_str).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyParts {
    /// The namespace.
    pub namespace: String,
    /// The scope (tenant or principal), `""` when none.
    pub scope: String,
    /// The client key.
    pub client_key: String,
}

impl KeyParts {
    /// Splits a stored key; `None` for a string that is not one.
    pub fn parse(stored: &str) -> Option<KeyParts> {
        let (namespace, rest) = length_prefixed(stored)?;
        let (scope, client_key) = length_prefixed(rest)?;
        Some(KeyParts {
            namespace: namespace.to_owned(),
            scope: scope.to_owned(),
            client_key: client_key.to_owned(),
        })
    }
}

/// `"3:abcrest"` → `("abc", "rest")`.
fn length_prefixed(s: &str) -> Option<(&str, &str)> {
    let (len, rest) = s.split_once(':')?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: usize = len.parse().ok()?;
    (rest.len() >= len && rest.is_char_boundary(len)).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Key;

    #[test]
    fn stored_keys_split_back_into_their_parts() {
        let key = Key::new("n:s", "a:b", "c:1").unwrap();
        let parts = KeyParts::parse(key.as_str()).unwrap();
        assert_eq!(
            (&*parts.namespace, &*parts.scope, &*parts.client_key),
            ("n:s", "a:b", "c:1")
        );
        assert_eq!(KeyParts::parse("nonsense"), None);
        assert_eq!(KeyParts::parse("9:ab"), None);
    }
}
