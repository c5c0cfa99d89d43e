//! The stores every case runs on, from idem-testing's store list.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use idem_core::store::Store;
use idem_core::Idempotent;
use idem_http::Options;
use idem_testing::{unique_name, Cleanup, Isolation, StoreKind, TestStore};

/// Where each backend's store lives, for an app in another process that
/// opens it by URL (`Adapter::FastApi`): the store, its URL and its name.
type Located = (Weak<dyn Store>, String, String);
static LOCATIONS: Mutex<Vec<Located>> = Mutex::new(Vec::new());

/// The URL (as `idempotence.open_store` takes it) and the name of a
/// backend's store; `None` for a store no backend made, or memory, which
/// lives in its own process only.
pub(crate) fn store_url(store: &Arc<dyn Store>) -> Option<(String, String)> {
    let wanted = Arc::as_ptr(store).cast::<()>();
    let mut locations = LOCATIONS.lock().unwrap_or_else(PoisonError::into_inner);
    locations.retain(|(store, _, _)| store.strong_count() > 0);
    locations
        .iter()
        .find(|(store, _, _)| store.as_ptr().cast::<()>() == wanted)
        .map(|(_, url, name)| (url.clone(), name.clone()))
}

/// One store the cases run on, with the guard that cleans it up.
#[derive(Debug)]
pub struct Backend {
    /// The store's name in test output.
    pub name: &'static str,
    /// The store.
    pub store: Arc<dyn Store>,
    _guard: Cleanup,
}

impl Backend {
    /// A handle on this store in a namespace no other case uses, so cases
    /// sharing one store never see each other's keys.
    pub fn idem(&self) -> Idempotent {
        Idempotent::from_arc(Arc::clone(&self.store)).with_namespace(unique_name("idem-http"))
    }

    /// Default options over [`idem`](Self::idem).
    pub fn options(&self) -> Options {
        Options::from_idempotent(self.idem())
    }
}

/// A fresh store of every kind ([`StoreKind::ALL`]); one whose server is
/// unreachable is skipped with a printed reason, or fails the case when
/// `CI` is set.
pub async fn backends() -> Vec<Backend> {
    let mut backends = Vec::new();
    for kind in StoreKind::ALL {
        if let Some(fresh) = kind.fresh().await {
            let url = match kind.isolation() {
                Isolation::Process => None,
                Isolation::File => Some(format!("sqlite:{}", fresh.location)),
                _ => Some(fresh.location.clone()),
            };
            if let Some(url) = url {
                LOCATIONS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((Arc::downgrade(&fresh.store), url, fresh.name.clone()));
            }
            backends.push(Backend {
                name: kind.name(),
                store: fresh.store,
                _guard: fresh.guard,
            });
        }
    }
    backends
}

/// The memory store alone, for an adapter whose cases need no other:
/// `Adapter::ProxyTls`, where TLS changes the transport, not the store.
pub(crate) async fn memory_backend() -> Vec<Backend> {
    let kind = StoreKind::Memory;
    let fresh = kind.fresh().await.into_iter();
    fresh
        .map(|fresh| Backend {
            name: kind.name(),
            store: fresh.store,
            _guard: fresh.guard,
        })
        .collect()
}
