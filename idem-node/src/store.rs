//! `openStore(url)`: a store named by URL, opened by its first call, with
//! idem-core's `NearCache` in front when asked.

use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::{NearCache, Store as CoreStore, StoreError};
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
    /// Whether settled records are kept in the process (idem-core's
    /// `NearCache`), so a replay needs no round trip.
    near_cache: bool,
    opened: OnceCell<Arc<dyn CoreStore>>,
}

#[async_trait]
impl Opener for Lazy {
    /// The store, opened on its first use.
    async fn open(&self) -> Result<Arc<dyn CoreStore>, StoreError> {
        let store = self
            .opened
            .get_or_try_init(|| async {
                let store = match &self.name {
                    Some(name) => self.url.open_named(name).await?,
                    None => self.url.open().await?,
                };
                // Each process keeps its own cache, made with its store.
                Ok::<_, StoreError>(if self.near_cache {
                    Arc::new(NearCache::new(store))
                } else {
                    store
                })
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

    /// Whether replays of settled records are answered from this process.
    #[napi(getter)]
    pub fn near_cache(&self) -> bool {
        self.inner.near_cache
    }
}

/// Names a store by URL: `memory`, `sqlite:PATH`, `redis://…`,
/// `rediss://…`, `postgres://…`, `mysql://…` or `mariadb://…`. Nothing is
/// opened until the first call that uses it. `name` is a Redis key prefix
/// or a SQL table. With `near_cache`, settled records are kept in the
/// process and replayed without a round trip (idem-core's `NearCache`, 60 s
/// at most).
#[napi(js_name = "openStore")]
pub fn open_store(
    url: String,
    name: Option<String>,
    near_cache: Option<bool>,
) -> napi::Result<Store> {
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
            near_cache: near_cache.unwrap_or(false),
            opened: OnceCell::new(),
        }),
    })
}
