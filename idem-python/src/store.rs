//! `open_store(url)`: a store named by URL, opened lazily in each process.

use std::sync::{Arc, Mutex, Weak};

use idem_core::store::{Store as CoreStore, StoreError};
use idem_stores::{StoreKind, StoreUrl};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio::sync::OnceCell;

/// A store by URL; see `open_store`.
#[pyclass(frozen, module = "idempotence", name = "Store")]
pub(crate) struct Store {
    url: StoreUrl,
    name: Option<String>,
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
                match &self.name {
                    Some(name) => self.url.open_named(name).await,
                    None => self.url.open().await,
                }
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

    fn __repr__(&self) -> String {
        match &self.name {
            Some(name) => format!("Store({:?}, name={name:?})", self.url.to_string()),
            None => format!("Store({:?})", self.url.to_string()),
        }
    }
}

/// Names a store by URL: `memory`, `sqlite:PATH`, `redis://…`,
/// `rediss://…`, `postgres://…`, `mysql://…` or `mariadb://…`. Nothing is
/// opened until the first call that uses it, in each process.
#[pyfunction]
#[pyo3(signature = (url, *, name = None))]
pub(crate) fn open_store(url: &str, name: Option<String>) -> PyResult<Store> {
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
    Ok(Store { url, name, opened })
}
