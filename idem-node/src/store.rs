//! `openStore(url)`: a store named by URL, opened by its first call.

use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::{Store as CoreStore, StoreError};
use idem_stores::{Opener, StoreKind, StoreUrl};
use napi::{Error, Status};
use napi_derive::napi;
use tokio::sync::OnceCell;

/// A store by URL; see `openStore`.
#[napi]
#[allow(missing_debug_implementations)]
pub struct Store {
    pub(crate) inner: Arc<Lazy>,
}

/// The URL and the store once opened. Each Node process (a `cluster`
/// worker, a child process) loads the addon afresh and opens its own.
pub(crate) struct Lazy {
    url: StoreUrl,
    name: Option<String>,
    opened: OnceCell<Arc<dyn CoreStore>>,
}

#[async_trait]
impl Opener for Lazy {
    /// The store, opened on its first use.
    async fn open(&self) -> Result<Arc<dyn CoreStore>, StoreError> {
        let store = self
            .opened
            .get_or_try_init(|| async {
                match &self.name {
                    Some(name) => self.url.open_named(name).await,
                    None => self.url.open().await,
                }
            })
            .await?;
        Ok(Arc::clone(store))
    }

    fn opened(&self) -> Option<Arc<dyn CoreStore>> {
        self.opened.get().cloned()
    }
}

#[napi]
impl Store {
    /// The store's URL, without its password.
    #[napi(getter)]
    pub fn url(&self) -> String {
        self.inner.url.to_string()
    }
}

/// Names a store by URL: `memory`, `sqlite:PATH`, `redis://…`,
/// `rediss://…`, `postgres://…`, `mysql://…` or `mariadb://…`. Nothing is
/// opened until the first call that uses it. `name` is a Redis key prefix
/// or a SQL table.
#[napi(js_name = "openStore")]
pub fn open_store(url: String, name: Option<String>) -> napi::Result<Store> {
    let url: StoreUrl = url.parse().map_err(|_| {
        let known: Vec<String> = StoreKind::ALL.iter().map(|k| k.url_form()).collect();
        // The URL is not repeated: it may hold a password.
        Error::new(
            Status::InvalidArg,
            format!(
                "not a store URL idem knows; the known forms are {}",
                known.join(", ")
            ),
        )
    })?;
    Ok(Store {
        inner: Arc::new(Lazy {
            url,
            name,
            opened: OnceCell::new(),
        }),
    })
}
