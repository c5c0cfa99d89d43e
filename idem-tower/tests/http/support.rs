//! What every case shares: the stores, the app under test, the server and
//! the client helpers.

use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{AppendHeaders, IntoResponse};
use axum::routing;
use axum::Router;
use idem_core::{Idempotent, MemoryStore, Store};
use idem_tower::IdempotencyLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// One store the cases run on, with whatever must live as long as it.
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) store: Arc<dyn Store>,
    _guard: Box<dyn Any + Send + Sync>,
}

impl Backend {
    pub(crate) fn new(name: &'static str, store: impl Store) -> Backend {
        Backend::with_guard(name, store, ())
    }

    /// A store with a guard that cleans it up when the case ends.
    pub(crate) fn with_guard(
        name: &'static str,
        store: impl Store,
        guard: impl Send + Sync + 'static,
    ) -> Backend {
        Backend {
            name,
            store: Arc::new(store),
            _guard: Box::new(guard),
        }
    }

    /// A handle on this store in a namespace no other case uses, so cases
    /// sharing one server never see each other's keys.
    pub(crate) fn idem(&self) -> Idempotent {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Idempotent::from_arc(Arc::clone(&self.store))
            .with_namespace(format!("idem-tower-{}-{nanos}-{n}", std::process::id()))
    }
}

/// The stores every case runs against; another backend is one more entry.
/// Redis, PostgreSQL and MariaDB are the servers named by `IDEM_REDIS_URL`,
/// `IDEM_POSTGRES_URL` and `IDEM_MYSQL_URL` (or the local ones); an
/// unreachable one is skipped
/// with a printed reason, or fails the case when `CI` is set.
pub(crate) async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sqlite = idem_sqlite::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("SQLite opens");
    let mut backends = vec![
        Backend::new("memory", MemoryStore::new()),
        Backend::with_guard("sqlite", sqlite, dir),
    ];
    if let Some(url) = server("IDEM_REDIS_URL", "redis://127.0.0.1:6379", 6379) {
        let store = idem_redis::RedisStore::connect(url.as_str())
            .await
            .expect("Redis connects")
            .with_prefix("idem-tower-test:");
        backends.push(Backend::new("redis", store));
    }
    let postgres = "postgres://root@127.0.0.1:5432/test";
    if let Some(url) = server("IDEM_POSTGRES_URL", postgres, 5432) {
        // One table for every case: each case has its own namespace.
        let store = idem_postgres::PostgresStore::connect(&url)
            .await
            .expect("PostgreSQL connects")
            .with_table("idem_tower_test")
            .expect("a plain table name");
        store.migrate().await.expect("the table is created");
        backends.push(Backend::new("postgres", store));
    }
    let mysql = "mysql://root@127.0.0.1:3306/test";
    if let Some(url) = server("IDEM_MYSQL_URL", mysql, 3306) {
        let store = idem_mysql::MySqlStore::connect(&url)
            .await
            .expect("MariaDB connects")
            .with_table("idem_tower_test")
            .expect("a plain table name");
        store.migrate().await.expect("the table is created");
        backends.push(Backend::new("mysql", store));
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

/// Runs `case` once on every backend, naming the backend in the output.
pub(crate) async fn on_every_backend<F, Fut>(case: F)
where
    F: Fn(Backend) -> Fut,
    Fut: Future<Output = ()>,
{
    for backend in backends().await {
        println!("backend: {}", backend.name);
        case(backend).await;
    }
}

/// The handlers behind the layer, counting their runs.
pub(crate) struct Handlers {
    pub(crate) runs: AtomicUsize,
    /// `/gated` waits here for a permit.
    pub(crate) gate: Semaphore,
}

impl Default for Handlers {
    fn default() -> Self {
        Handlers {
            runs: AtomicUsize::new(0),
            gate: Semaphore::new(0),
        }
    }
}

impl Handlers {
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn run(&self) -> usize {
        self.runs.fetch_add(1, Ordering::SeqCst) + 1
    }
}

async fn payments(
    State(h): State<Arc<Handlers>>,
    headers: HeaderMap,
    body: String,
) -> impl IntoResponse {
    let run = h.run();
    let tenant = headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    (
        StatusCode::CREATED,
        AppendHeaders([
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::SET_COOKIE, format!("session=s{run}; HttpOnly")),
            (header::HeaderName::from_static("x-multi"), "a".to_owned()),
            (header::HeaderName::from_static("x-multi"), "b".to_owned()),
            (header::HeaderName::from_static("x-run"), run.to_string()),
        ]),
        format!(
            r#"{{"run":{run},"tenant":"{tenant}","echo":{}}}"#,
            body.len()
        ),
    )
}

async fn count(State(h): State<Arc<Handlers>>) -> String {
    h.runs().to_string()
}

async fn binary(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    let run = h.run() as u8;
    let mut body: Vec<u8> = (0..=255).collect();
    body.push(run);
    (
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        body,
    )
}

async fn gated(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    let run = h.run();
    // A closed semaphore means the test is over; answering is fine then.
    let _permit = h.gate.acquire().await;
    (StatusCode::CREATED, format!("run {run}"))
}

async fn flaky(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    match h.run() {
        1 => (StatusCode::SERVICE_UNAVAILABLE, "try again".to_owned()),
        run => (StatusCode::CREATED, format!("run {run}")),
    }
}

async fn big(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    h.run();
    vec![b'x'; BIG_BODY]
}

async fn broken(State(h): State<Arc<Handlers>>) -> axum::body::Body {
    h.run();
    let chunks: [Result<&'static str, std::io::Error>; 2] = [
        Ok("half a response"),
        Err(std::io::Error::other("the stream broke")),
    ];
    axum::body::Body::from_stream(futures_util::stream::iter(chunks))
}

async fn panics(State(h): State<Arc<Handlers>>) -> &'static str {
    h.run();
    panic!("the handler panics on purpose");
}

/// The size `/big` answers with.
pub(crate) const BIG_BODY: usize = 4096;

/// The app under test: the handlers behind `layer`.
pub(crate) fn app(layer: IdempotencyLayer) -> (Router, Arc<Handlers>) {
    let handlers = Arc::new(Handlers::default());
    let router = Router::new()
        .route(
            "/payments",
            routing::post(payments).patch(payments).get(count),
        )
        .route("/other", routing::post(payments))
        .route("/binary", routing::post(binary))
        .route("/gated", routing::post(gated))
        .route("/flaky", routing::post(flaky))
        .route("/big", routing::post(big))
        .route("/broken", routing::post(broken))
        .route("/panic", routing::post(panics))
        .with_state(Arc::clone(&handlers))
        .layer(layer);
    (router, handlers)
}

/// Serves `router` on a free port of 127.0.0.1 until the test ends.
pub(crate) async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// The app behind `layer`, served: its address and its handlers.
pub(crate) async fn start(layer: IdempotencyLayer) -> (String, Arc<Handlers>) {
    let (router, handlers) = app(layer);
    let addr = serve(router).await;
    (format!("http://{addr}"), handlers)
}

/// A POST of `body` to `url` with the key, if any.
pub(crate) fn post(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::RequestBuilder {
    let request = client
        .post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.to_owned());
    match key {
        Some(key) => request.header("idempotency-key", key),
        None => request,
    }
}

/// Checks that `response` is a problem document with `status` and returns
/// its `type`.
pub(crate) async fn problem(response: reqwest::Response, status: u16) -> String {
    assert_eq!(response.status().as_u16(), status, "status of {response:?}");
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let doc: serde_json::Value = response.json().await.unwrap();
    assert_eq!(doc["status"], status, "{doc}");
    for member in ["type", "title", "detail"] {
        assert!(
            doc[member].as_str().is_some_and(|s| !s.is_empty()),
            "{member} in {doc}"
        );
    }
    doc["type"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned()
}

/// Sends raw bytes and reads the answer until the server closes.
pub(crate) async fn raw(addr: &str, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr.trim_start_matches("http://"))
        .await
        .unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the server answers within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Polls `check` every 10 ms for up to five seconds.
pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}
