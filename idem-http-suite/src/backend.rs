//! The stores every case runs on.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_core::{Idempotent, MemoryStore, Store};
use idem_http::Options;

/// One store the cases run on, with whatever must live as long as it.
pub struct Backend {
    /// The store's name in test output.
    pub name: &'static str,
    /// The store.
    pub store: Arc<dyn Store>,
    _guard: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("name", &self.name).finish()
    }
}

impl Backend {
    fn new(name: &'static str, store: impl Store, guard: impl Send + Sync + 'static) -> Backend {
        Backend {
            name,
            store: Arc::new(store),
            _guard: Box::new(guard),
        }
    }

    /// A handle on this store in a namespace no other case uses, so cases
    /// sharing one server never see each other's keys.
    pub fn idem(&self) -> Idempotent {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Idempotent::from_arc(Arc::clone(&self.store))
            .with_namespace(format!("idem-http-{}-{nanos}-{n}", std::process::id()))
    }

    /// Default options over [`idem`](Self::idem).
    pub fn options(&self) -> Options {
        Options::from_idempotent(self.idem())
    }
}

/// The stores every case runs against; another backend is one more entry.
/// Redis and PostgreSQL are the servers named by `IDEM_REDIS_URL` and
/// `IDEM_POSTGRES_URL` (or the local ones); an unreachable one is skipped
/// with a printed reason, or fails the case when `CI` is set.
pub async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = idem_sqlite::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("SQLite opens");
    let mut backends = vec![
        Backend::new("memory", MemoryStore::new(), ()),
        Backend::new("sqlite", sqlite, dir),
    ];
    if let Some(url) = server("IDEM_REDIS_URL", "redis://127.0.0.1:6379", 6379) {
        let store = idem_redis::RedisStore::connect(url.as_str())
            .await
            .expect("Redis connects")
            .with_prefix("idem-http-test:");
        backends.push(Backend::new("redis", store, ()));
    }
    let postgres = "postgres://root@127.0.0.1:5432/test";
    if let Some(url) = server("IDEM_POSTGRES_URL", postgres, 5432) {
        // One table for every case: each case has its own namespace.
        let store = idem_postgres::PostgresStore::connect(&url)
            .await
            .expect("PostgreSQL connects")
            .with_table("idem_http_test")
            .expect("a plain table name");
        store.migrate().await.expect("the table is created");
        backends.push(Backend::new("postgres", store, ()));
    }
    backends
}

fn server(var: &str, default: &str, port: u16) -> Option<String> {
    let url = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    if std::env::var(var).is_ok() || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        return Some(url);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{url} is not reachable and CI is set"
    );
    eprintln!("skipping {url}: not reachable");
    None
}
