//! The harness's own HTTP load: keep-alive connections from a hyper client,
//! one request per operation, driven by the same runner as the store rows.

use async_trait::async_trait;
use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::fixture::{BoxError, Order};
use crate::runner::{Outcome, Protocol};

/// One client per row: its pool keeps one connection per concurrent
/// caller open, so 32 callers make 32 keep-alive connections.
pub(crate) fn client(connections: usize) -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build(connector)
}

/// `POST <url>` with the 100-byte order as JSON and the operation's key in
/// `Idempotency-Key`.
pub(crate) struct HttpRow {
    client: Client<HttpConnector, Full<Bytes>>,
    url: http::Uri,
    body: Bytes,
}

impl HttpRow {
    pub(crate) fn new(client: Client<HttpConnector, Full<Bytes>>, url: http::Uri) -> HttpRow {
        HttpRow {
            client,
            url,
            // An Order always encodes.
            body: Bytes::from(serde_json::to_vec(&Order::sample()).unwrap_or_default()),
        }
    }
}

#[async_trait]
impl Protocol for HttpRow {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header("idempotency-key", key)
            .body(Full::new(self.body.clone()))?;
        let response = self.client.request(request).await?;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        // The whole body is read, as a client would, before the next request
        // goes on the same connection.
        let body = response.into_body().collect().await?.to_bytes();
        match status {
            StatusCode::CONFLICT => Ok(Outcome::InProgress),
            s if s.is_success() && replayed => Ok(Outcome::Replayed),
            s if s.is_success() => Ok(Outcome::Ran),
            s => Err(format!("HTTP {s}: {}", String::from_utf8_lossy(&body)).into()),
        }
    }
}
