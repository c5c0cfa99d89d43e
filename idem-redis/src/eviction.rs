//! The maxmemory-policy check: a server that may evict any key
//! (`allkeys-*`) would drop records silently, and a retry would run its
//! work again, so the store refuses to claim on it unless told otherwise.
//!
//! The policy is read from `INFO memory` (`maxmemory_policy`), which
//! managed servers answer where `CONFIG` is disabled. It is read when the
//! store connects and then again by the first claim after each interval,
//! because the policy can change at run time. Only claims are refused:
//! work already running still records its outcome.

use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::store::StoreError;
use redis::Value;

use crate::record::BACKEND;
use crate::RedisStore;

/// How often claims read the policy again unless told otherwise.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// The policy check of one store and its clones.
#[derive(Debug)]
pub(crate) struct Eviction {
    /// The user accepted a policy that may evict records.
    allowed: bool,
    interval_ms: u64,
    since: Instant,
    /// When the next claim reads the policy, in ms after `since`.
    next_ms: AtomicU64,
    checking: AtomicBool,
    refused: AtomicBool,
    /// The evicting policy found, when `refused`.
    policy: Mutex<String>,
}

impl Eviction {
    pub(crate) fn new(allowed: bool, interval: Duration) -> Eviction {
        Eviction {
            allowed,
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            since: Instant::now(),
            next_ms: AtomicU64::new(0),
            checking: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            policy: Mutex::new(String::new()),
        }
    }

    pub(crate) fn allowed(&self) -> bool {
        self.allowed
    }

    pub(crate) fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    /// `Ok` unless the server's policy may evict records and the user did
    /// not accept it. Reads the policy when it is due; one caller at a
    /// time does, the others go by the last reading.
    pub(crate) async fn check(&self, store: &RedisStore) -> Result<(), StoreError> {
        if self.allowed {
            return Ok(());
        }
        let now = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        if now >= self.next_ms.load(Ordering::Relaxed)
            && !self.checking.swap(true, Ordering::Acquire)
        {
            // Cleared however this ends: a caller dropped mid-read (a
            // request's timeout) must not stop every later check.
            let _checking = ClearOnDrop(&self.checking);
            match store.maxmemory_policies().await {
                Ok(policies) => {
                    let evicting = policies.into_iter().find(|p| evicts_records(p));
                    self.refused.store(evicting.is_some(), Ordering::Relaxed);
                    if let Some(policy) = evicting {
                        *self.policy.lock().unwrap_or_else(PoisonError::into_inner) = policy;
                    }
                }
                // A server that hides INFO cannot be checked: the store
                // serves, and says so.
                Err(error) => tracing::warn!(
                    %error,
                    "idem-redis could not read the server's maxmemory-policy (INFO memory)"
                ),
            }
            self.next_ms
                .store(now.saturating_add(self.interval_ms), Ordering::Relaxed);
        }
        if self.refused.load(Ordering::Relaxed) {
            let policy = self
                .policy
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            return Err(StoreError::config(BACKEND, EvictingPolicy { policy }));
        }
        Ok(())
    }
}

/// Clears a flag when dropped.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Whether a server with this `maxmemory-policy` may evict records: the
/// `allkeys-*` policies take any key; the `volatile-*` ones only keys with
/// an expiry, which records never carry. The rule the store's check
/// applies, for tools that diagnose a server (`idem doctor`).
pub fn evicts_records(policy: &str) -> bool {
    policy.starts_with("allkeys-")
}

impl RedisStore {
    /// The `maxmemory_policy` of every server `INFO` reaches: the one
    /// server, or every master of a cluster.
    async fn maxmemory_policies(&self) -> Result<Vec<String>, redis::RedisError> {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let reply = self.connection.query(&info).await?;
        let mut policies = Vec::new();
        collect_policies(&reply, &mut policies);
        Ok(policies)
    }
}

/// Every `maxmemory_policy:` line in an `INFO` reply: a string from one
/// server, or a map of them from a cluster's masters.
fn collect_policies(reply: &Value, out: &mut Vec<String>) {
    let text = match reply {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => text.clone(),
        Value::Array(items) | Value::Set(items) => {
            return items.iter().for_each(|item| collect_policies(item, out));
        }
        Value::Map(pairs) => {
            return pairs
                .iter()
                .for_each(|(_, item)| collect_policies(item, out));
        }
        _ => return,
    };
    out.extend(
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
            .map(str::to_owned),
    );
}

/// The server may evict any key when memory runs out.
#[derive(Debug)]
struct EvictingPolicy {
    policy: String,
}

impl fmt::Display for EvictingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server's maxmemory-policy is {}, which evicts idempotency records when memory \
             runs out, and a retry then runs its work again; set maxmemory-policy to \
             noeviction or a volatile-* policy (records carry no expiry, so volatile-* \
             policies never evict them), or accept the risk with \
             RedisStore::with_record_eviction_allowed(true)",
            self.policy
        )
    }
}

impl StdError for EvictingPolicy {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_read_from_one_server_or_every_master() {
        let one = Value::BulkString(
            b"# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n".to_vec(),
        );
        let mut found = Vec::new();
        collect_policies(&one, &mut found);
        assert_eq!(found, ["noeviction"]);
        let cluster = Value::Map(vec![
            (Value::SimpleString("a:1".into()), one),
            (
                Value::SimpleString("b:2".into()),
                Value::VerbatimString {
                    format: redis::VerbatimFormat::Text,
                    text: "maxmemory_policy:allkeys-lru\r\n".into(),
                },
            ),
        ]);
        let mut found = Vec::new();
        collect_policies(&cluster, &mut found);
        assert_eq!(found, ["noeviction", "allkeys-lru"]);
    }

    #[test]
    fn the_refusal_says_what_to_change() {
        let message = EvictingPolicy {
            policy: "allkeys-lru".into(),
        }
        .to_string();
        for needed in [
            "allkeys-lru",
            "noeviction",
            "volatile-",
            "with_record_eviction_allowed",
        ] {
            assert!(message.contains(needed), "{message}");
        }
    }
}
