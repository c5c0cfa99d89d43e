//! [`Inspect`] for [`RedisStore`]: listing and counting records with
//! `SCAN` over the store's prefix.
//!
//! Each key a scan finds is read with the store's own [`Store::load`]
//! (one script, `lua/load.lua`, decoded by `record::decode`), so
//! listing costs one round trip per key found and `stats` walks every key
//! under the prefix: run it on a replica or at a quiet moment for large
//! stores. On Redis Cluster a scan sees one node only.

use async_trait::async_trait;
use idem_core::inspect::{page_limit, Inspect, Listed, Listing, Page, Stats};
use idem_core::store::{Store, StoreError};
use redis::Value;

use crate::connection::command;
use crate::record::BACKEND;
use crate::RedisStore;

// A page runs scan steps until it has found a record or walked this many
// steps, so a listing over a store that holds mostly other states still
// answers promptly; `next` carries on from there.
const MAX_STEPS: usize = 16;
const SCAN_WORK: usize = 1000;

impl RedisStore {
    /// One `SCAN` step from `cursor`: the next cursor and the store keys
    /// (without the prefix) it found.
    async fn scan(&self, cursor: u64, count: usize) -> Result<(u64, Vec<String>), StoreError> {
        let pattern = glob_escape(&self.prefix);
        let mut cmd = command("SCAN", 5, pattern.len() + 32);
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(&pattern[..])
            .arg("COUNT")
            .arg(count)
            .arg("TYPE")
            .arg("string");
        let reply = self
            .connection
            .query(&cmd)
            .await
            .map_err(|e| StoreError::backend(BACKEND, e))?;
        let bad = || StoreError::backend(BACKEND, format!("SCAN answered {reply:?}"));
        let Value::Array(parts) = &reply else {
            return Err(bad());
        };
        let [next, Value::Array(keys)] = &parts[..] else {
            return Err(bad());
        };
        let next: u64 = match next {
            Value::BulkString(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        let keys = keys
            .iter()
            .filter_map(|key| match key {
                Value::BulkString(bytes) => bytes
                    .strip_prefix(&self.prefix[..])
                    .and_then(|rest| String::from_utf8(rest.to_vec()).ok()),
                _ => None,
            })
            .collect();
        Ok((next, keys))
    }
}

/// The prefix as a `SCAN MATCH` pattern: its glob characters escaped,
/// then `*`.
pub(crate) fn glob_escape(prefix: &[u8]) -> Vec<u8> {
    let mut pattern = Vec::with_capacity(prefix.len() + 8);
    for &b in prefix {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            pattern.push(b'\\');
        }
        pattern.push(b);
    }
    pattern.push(b'*');
    pattern
}

fn cursor(after: Option<&str>) -> Result<u64, StoreError> {
    after.map_or(Ok(0), |after| {
        after.parse().map_err(|_| {
            StoreError::config(
                BACKEND,
                format!("{after:?} is not a page cursor of this store (a number from `next`)"),
            )
        })
    })
}

#[async_trait]
impl Inspect for RedisStore {
    /// Pages follow `SCAN`: `next` is its cursor. A page holds the
    /// matching records of the scan steps it ran (each walks at least 1000
    /// keys), so it may hold more than `limit`.
    async fn list(
        &self,
        listing: Listing,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let limit = page_limit(limit);
        let mut at = cursor(after)?;
        let mut records = Vec::new();
        for _ in 0..MAX_STEPS {
            // COUNT is how many slots a step walks, not how many keys it
            // returns: on a server shared with other data most slots hold
            // other keys, so a step walks at least SCAN_WORK of them.
            let (next, keys) = self.scan(at, limit.max(SCAN_WORK)).await?;
            for key in keys {
                // Gone since the scan saw it, or expired: not listed.
                if let Some(record) = self.load(&key).await? {
                    if record.state == listing.state() {
                        records.push(Listed { key, record });
                    }
                }
            }
            at = next;
            if at == 0 || !records.is_empty() {
                break;
            }
        }
        let next = (at != 0).then(|| at.to_string());
        Ok(Page { records, next })
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let mut stats = Stats::default();
        let mut at = 0;
        loop {
            let (next, keys) = self.scan(at, SCAN_WORK).await?;
            for key in keys {
                // Records carry no Redis TTL: a key the scan saw that reads
                // as absent is past its retention, kept until a purge (or
                // deleted a moment ago: the counts are a moment's).
                match self.load(&key).await? {
                    Some(record) => stats.add(&record),
                    None => stats.expired += 1,
                }
            }
            if next == 0 {
                return Ok(stats);
            }
            at = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_literally() {
        assert_eq!(glob_escape(b"a*b:"), b"a\\*b:*".to_vec());
        assert!(cursor(Some("x")).is_err());
        assert_eq!(cursor(Some("17")).unwrap(), 17);
    }
}
