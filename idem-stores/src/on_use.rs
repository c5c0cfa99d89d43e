//! A store opened by its first call: what the Python and Node packages hand
//! to idem-http, whose options are built before the store can be opened
//! (at import, before a pre-fork server forks its workers).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Reset, Store, StoreError, Token, Wakeups};

/// Opens a store when it is first needed, and says whether it is open in
/// this process. The opener decides when a store is opened again (in a
/// forked child, say); every call goes to the store it answers with.
#[async_trait]
pub trait Opener: Send + Sync + 'static {
    /// The store, opened now if it is not yet open in this process. A
    /// failure to open is a store failure like any other.
    async fn open(&self) -> Result<Arc<dyn Store>, StoreError>;

    /// The store if it is open in this process, without opening it.
    fn opened(&self) -> Option<Arc<dyn Store>>;
}

/// A [`Store`] whose every call goes to the store its [`Opener`] opens.
#[derive(Clone)]
pub struct OpenOnUse(Arc<dyn Opener>);

impl OpenOnUse {
    /// The store `opener` opens, opened by its first call; the opener may
    /// be shared with other users of the same store.
    pub fn new<O: Opener>(opener: Arc<O>) -> OpenOnUse {
        OpenOnUse(opener)
    }
}

impl fmt::Debug for OpenOnUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenOnUse")
            .field("opened", &self.0.opened().is_some())
            .finish()
    }
}

#[async_trait]
impl Store for OpenOnUse {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        self.0.open().await?.insert(key, record).await
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.0.open().await?.swap(key, expected, record).await
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.0.open().await?.take_over(key, expected, record).await
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        self.0.open().await?.remove(key, expected).await
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.0.open().await?.load(key).await
    }

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        self.0.open().await?.reset(key).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.0.open().await?.purge_expired(limit).await
    }

    // A waiter has claimed first, so the store is open in this process by
    // the time it asks; before that, polling is never wrong.
    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        self.0.opened().and_then(|store| store.wakeups())
    }
}
