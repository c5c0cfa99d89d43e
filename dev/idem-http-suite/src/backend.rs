//! The stores every case runs on, from idem-testing's store list.

use std::sync::Arc;

use idem_core::store::Store;
use idem_core::Idempotent;
use idem_http::Options;
use idem_testing::{unique_name, Cleanup, StoreKind, TestStore};

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
            backends.push(Backend {
                name: kind.name(),
                store: fresh.store,
                _guard: fresh.guard,
            });
        }
    }
    backends
}
