//! The store as a handle calls it: each call of the wrapped store timed,
//! traced and counted under the handle's labels.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use super::{record_on_current, Observe};
use crate::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token};

/// The store as a handle calls it: every call timed, traced and counted.
/// [`Idempotent::store`](crate::Idempotent::store) still returns the store
/// itself, so calls made on it directly are not counted.
#[derive(Clone)]
pub(crate) struct ObservedStore {
    inner: Arc<dyn Store>,
    pub(crate) observe: Observe,
}

impl fmt::Debug for ObservedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Shows as the store it wraps.
        self.inner.fmt(f)
    }
}

impl ObservedStore {
    pub(crate) fn new(inner: Arc<dyn Store>, observe: Observe) -> ObservedStore {
        ObservedStore { inner, observe }
    }

    fn record_outcome(outcome: &'static str) {
        record_on_current("outcome", outcome);
    }
}

/// The store's name for labels: from its `Debug` form's type name
/// (`SqliteStore { .. }` is `sqlite`), lower case, without `Store`.
pub(crate) fn store_name(store: &dyn Store) -> Arc<str> {
    let shown = format!("{store:?}");
    let name: String = shown
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let name = name.strip_suffix("Store").unwrap_or(&name);
    if name.is_empty() {
        Arc::from("store")
    } else {
        Arc::from(name.to_ascii_lowercase())
    }
}

impl ObservedStore {
    /// [`Store::insert`] without the trait's boxed future: the claim every
    /// `begin` makes awaits it in place.
    pub(crate) async fn claim(
        &self,
        key: &str,
        record: &NewRecord<'_>,
    ) -> Result<Insert, StoreError> {
        self.observe
            .call("insert", "before", async {
                let answer = (*self.inner).insert(key, record).await;
                if let Ok(insert) = &answer {
                    Self::record_outcome(match insert {
                        Insert::Inserted => "inserted",
                        Insert::Found(_) => "found",
                    });
                }
                answer
            })
            .await
    }
}

#[async_trait]
impl Store for ObservedStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        self.claim(key, record).await
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let (op, work, done) = match record.state {
            State::InFlight => ("renew", "during", None),
            State::Completed => ("complete", "after", Some("idem_completed_total")),
            State::Failed => ("fail", "after", Some("idem_failures_remembered_total")),
        };
        let answer = self
            .observe
            .call(op, work, async {
                let answer = (*self.inner).swap(key, expected, record).await;
                if let Ok(swapped) = answer {
                    Self::record_outcome(if swapped { "swapped" } else { "lease_lost" });
                }
                answer
            })
            .await;
        match (answer.as_ref(), done) {
            (Ok(true), Some(name)) => self.observe.count(name),
            (Ok(false), _) => self.observe.count("idem_lease_lost_total"),
            _ => {}
        }
        answer
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let answer = self
            .observe
            .call("take_over", "before", async {
                let answer = (*self.inner).take_over(key, expected, record).await;
                if let Ok(taken) = answer {
                    Self::record_outcome(if taken { "taken_over" } else { "lost_race" });
                }
                answer
            })
            .await;
        if let Ok(true) = answer {
            self.observe.count("idem_taken_over_total");
        }
        answer
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let answer = self
            .observe
            .call("release", "after", async {
                let answer = (*self.inner).remove(key, expected).await;
                if let Ok(removed) = answer {
                    Self::record_outcome(if removed { "released" } else { "lease_lost" });
                }
                answer
            })
            .await;
        match answer {
            Ok(true) => self.observe.count("idem_released_total"),
            Ok(false) => self.observe.count("idem_lease_lost_total"),
            Err(_) => {}
        }
        answer
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.observe
            .call("load", "none", (*self.inner).load(key))
            .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.observe
            .call("purge_expired", "none", (*self.inner).purge_expired(limit))
            .await
    }

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        let answer = self
            .observe
            .call("reset", "none", async {
                let answer = (*self.inner).reset(key).await;
                if let Ok(reset) = answer {
                    Self::record_outcome(reset.as_str());
                }
                answer
            })
            .await;
        if let Ok(reset) = answer {
            self.observe.reset(reset);
        }
        answer
    }

    fn wakeups(&self) -> Option<Arc<crate::store::Wakeups>> {
        self.inner.wakeups()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[test]
    fn store_names_come_from_the_type() {
        assert_eq!(&*store_name(&MemoryStore::new()), "memory");
    }
}
