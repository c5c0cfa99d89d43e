//! Starting upstreams and proxies.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::Store;
use idem_proxy::{Proxy, ProxyBuilder, Route};
use idem_testing::upstream::{Language, Upstream};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The Python upstream, or `None` (skipped) without `python3`.
pub(crate) fn python() -> Option<Upstream> {
    Language::Python
        .available()
        .then(|| Upstream::start(Language::Python))
}

/// A proxy served in this process until the returned sender is used or
/// dropped: its base URL.
pub(crate) async fn serve(builder: ProxyBuilder) -> (String, oneshot::Sender<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(builder.build().serve(listener, async {
        let _ = stopped.await;
    }));
    (url, stop)
}

/// A proxy to `upstream` with one route over `store`.
pub(crate) fn builder(upstream: &Upstream, route: Route) -> ProxyBuilder {
    Proxy::builder(upstream.url().parse().unwrap()).route(route)
}

/// A fresh SQLite store in a temporary directory, the proxy's default.
pub(crate) async fn sqlite() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let store = url
        .parse::<idem_stores::StoreUrl>()
        .unwrap()
        .open()
        .await
        .unwrap();
    (store, dir)
}

/// Polls `check` every 10 ms for up to `bound`.
pub(crate) async fn until<F, Fut>(what: &str, bound: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The problem name of a problem+json answer with `status`.
pub(crate) async fn problem(response: reqwest::Response, status: u16) -> String {
    assert_eq!(response.status().as_u16(), status, "{response:?}");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let doc: serde_json::Value = response.json().await.unwrap();
    assert_eq!(doc["status"], status);
    doc["type"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned()
}
