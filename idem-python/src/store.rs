//! `open_store(url)`: a store named by URL, opened lazily in each process.

use std::sync::{Arc, Mutex, Weak};

use idem_core::store::{NearCache, Store as CoreStore, StoreError};
use idem_stores::{StoreKind, StoreUrl};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio::sync::OnceCell;

/// A store by URL; see `open_store`.
#[pyclass(frozen, module = "idempotence", name = "Store")]
pub(crate) struct Store {
    url: StoreUrl,
    name: Option<String>,
    /// Whether settled records are kept in the process (idem-core's
    /// `NearCache`), so a replay needs no round trip.
    near_cache: bool,
    // The store as opened in one process. A forked child finds another
    // process id here and opens its own: connections, pools and SQLite's
    // writer thread do not survive a fork.
    opened: Arc<Opened>,
}

/// One process's store, opened by the first call that needs it.
type Opening = OnceCell<Arc<dyn CoreStore>>;

/// A store's opening and the process it was made in.
type Opened = Mutex<Option<(u32, Arc<Opening>)>>;

/// Every store made, so that a fork can close those opened (see the
/// runtime module).
static MADE: Mutex<Vec<Weak<Opened>>> = Mutex::new(Vec::new());

/// Takes every store opened in this process out of its `Store`, which
/// opens it again on its next use: the caller drops them.
pub(crate) fn close_all() -> Vec<Arc<dyn CoreStore>> {
    let pid = std::process::id();
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    made.retain(|opened| opened.strong_count() > 0);
    let mut closed = Vec::new();
    for opened in made.iter().filter_map(Weak::upgrade) {
        let mut opened = opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((owner, cell)) = opened.take() {
            if owner == pid {
                closed.extend(cell.get().cloned());
            }
        }
    }
    closed
}

impl Store {
    /// The store, opened in this process on its first use.
    pub(crate) async fn open(&self) -> Result<Arc<dyn CoreStore>, StoreError> {
        if let Some(calls) = crate::runtime::forked_while_busy() {
            return Err(StoreError::config(
                "python",
                format!(
                    "this process was forked while {calls} idempotent call(s) ran in its \
                     parent, whose threads and connections could not be closed first; \
                     fork before making calls or while none runs"
                ),
            ));
        }
        let pid = std::process::id();
        let cell = {
            let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
            match &*opened {
                Some((owner, cell)) if *owner == pid => Arc::clone(cell),
                _ => {
                    let cell = Arc::new(OnceCell::new());
                    *opened = Some((pid, Arc::clone(&cell)));
                    cell
                }
            }
        };
        let store = cell
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
}

impl Store {
    /// The store if it is open in this process, without opening it.
    pub(crate) fn opened(&self) -> Option<Arc<dyn CoreStore>> {
        let opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        match &*opened {
            Some((owner, cell)) if *owner == std::process::id() => cell.get().cloned(),
            _ => None,
        }
    }
}

#[pymethods]
impl Store {
    /// The store's URL, without its password.
    #[getter]
    fn url(&self) -> String {
        self.url.to_string()
    }

    /// Whether replays of settled records are answered from this process.
    #[getter]
    fn near_cache(&self) -> bool {
        self.near_cache
    }

    fn __repr__(&self) -> String {
        let name = match &self.name {
            Some(name) => format!(", name={name:?}"),
            None => String::new(),
        };
        let near = if self.near_cache {
            ", near_cache=True"
        } else {
            ""
        };
        format!("Store({:?}{name}{near})", self.url.to_string())
    }
}

/// Names a store by URL: `memory`, `sqlite:PATH`, `redis://…`,
/// `rediss://…`, `postgres://…`, `mysql://…` or `mariadb://…`. Nothing is
/// opened until the first call that uses it, in each process. With
/// `near_cache`, settled records are kept in each process and replayed
/// without a round trip (idem-core's `NearCache`, 60 s at most).
#[pyfunction]
#[pyo3(signature = (url, *, name = None, near_cache = false))]
pub(crate) fn open_store(url: &str, name: Option<String>, near_cache: bool) -> PyResult<Store> {
    let url: StoreUrl = url.parse().map_err(|_| {
        let known: Vec<String> = StoreKind::ALL.iter().map(|k| k.url_form()).collect();
        // The URL is not repeated: it may hold a password.
        PyValueError::new_err(format!(
            "not a store URL idem knows; the known forms are {}",
            known.join(", ")
        ))
    })?;
    let opened = Arc::new(Mutex::new(None));
    MADE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::downgrade(&opened));
    Ok(Store {
        url,
        name,
        near_cache,
        opened,
    })
}
