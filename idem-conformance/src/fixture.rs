//! What a store author provides: a [`Factory`] that builds one isolated
//! [`Fixture`] per case.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::{NearCache, Store};

/// A fresh, isolated store for one case, and whatever must live as long as
/// it does.
///
/// The guard is dropped after the case ends, and with it whatever the
/// factory set up: a temporary file, a dropped table, a deleted key prefix.
/// Every case gets its own fixture and cases run in parallel, so two
/// fixtures must never see each other's records.
pub struct Fixture {
    store: Arc<dyn Store>,
    stored: Option<Count>,
    // Declared after `store` so the store is dropped first: a guard that
    // removes a file or a table must not pull it from under a live store.
    _guard: Box<dyn Any + Send + Sync>,
}

/// What [`Fixture::with_stored_count`] keeps: a count, on demand.
type Count = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = usize> + Send>> + Send + Sync>;

impl Fixture {
    /// A fixture over `store`, keeping `guard` alive until the case ends.
    /// Pass `()` when there is nothing to clean up.
    pub fn new<S: Store>(store: S, guard: impl Send + Sync + 'static) -> Fixture {
        Fixture::from_arc(Arc::new(store), guard)
    }

    /// A fixture over an already shared store.
    pub fn from_arc(store: Arc<dyn Store>, guard: impl Send + Sync + 'static) -> Fixture {
        Fixture {
            store,
            stored: None,
            _guard: Box::new(guard),
        }
    }

    /// The same fixture, able to count the records its store holds in the
    /// backend: `count` reads the backend directly, never through the
    /// store, and answers how many records are stored under the fixture's
    /// table, file or key prefix, **whether past retention or not**.
    ///
    /// Through the store an expired record looks absent whether it was
    /// deleted or not, so only this count shows that
    /// [`purge_expired`](idem_core::store::Store::purge_expired) deletes
    /// what it must (the case `expiry::purge_expired_leaves_no_expired_record_stored`,
    /// which fails without it). A record the backend expired by itself (a
    /// Redis TTL) counts as gone, as the backend reports it. `count`
    /// panics if the backend cannot answer, as a factory does.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use idem_conformance::Fixture;
    /// use idem_core::MemoryStore;
    ///
    /// async fn factory() -> Fixture {
    ///     let store = Arc::new(MemoryStore::new());
    ///     let held = Arc::clone(&store);
    ///     Fixture::from_arc(store, ()).with_stored_count(move || {
    ///         let held = Arc::clone(&held);
    ///         async move { held.len() }
    ///     })
    /// }
    /// ```
    pub fn with_stored_count<F, Fut>(self, count: F) -> Fixture
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = usize> + Send + 'static,
    {
        Fixture {
            stored: Some(Arc::new(move || Box::pin(count()))),
            ..self
        }
    }

    /// How many records the backend holds for this fixture, past retention
    /// or not; `None` when the factory gave no
    /// [`with_stored_count`](Fixture::with_stored_count).
    pub async fn stored_count(&self) -> Option<usize> {
        match &self.stored {
            Some(count) => Some(count().await),
            None => None,
        }
    }

    /// The same fixture with its store behind a
    /// [`NearCache`](idem_core::store::NearCache), so that the whole kit
    /// runs through the cache: a cache that answers what the store would
    /// not fails the case that catches that answer.
    pub fn with_near_cache(self) -> Fixture {
        Fixture {
            store: Arc::new(NearCache::new(self.store)),
            ..self
        }
    }

    /// The store under test.
    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }
}

impl fmt::Debug for Fixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fixture")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Builds a fresh, isolated [`Fixture`] for each case.
///
/// Any `async fn() -> Fixture` (or closure returning such a future) is a
/// factory already; implement the trait by hand only to carry state, such
/// as a connection pool shared by all fixtures.
#[async_trait]
pub trait Factory: Send + Sync + 'static {
    /// A new fixture, isolated from every other one this factory made.
    async fn fixture(&self) -> Fixture;
}

#[async_trait]
impl<F, Fut> Factory for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Fixture> + Send,
{
    async fn fixture(&self) -> Fixture {
        self().await
    }
}
