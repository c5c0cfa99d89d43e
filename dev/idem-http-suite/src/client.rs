//! The client side: requests, and checks on what comes back.

use std::future::Future;
use std::time::Duration;

use reqwest::header::{self, HeaderMap};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The body most cases send.
pub const BODY: &str = r#"{"amount":1250,"currency":"EUR"}"#;

/// A JSON POST of `body` to `url` with the key, if any.
pub fn post(
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
/// its name (the last segment of its `type`).
pub async fn problem(response: reqwest::Response, status: u16) -> String {
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

/// The headers a replay must repeat: all but the connection's own and the
/// ones never recorded. Node's server adds `connection` and `keep-alive`
/// to every response it keeps the connection open after.
pub fn replayable(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut replayable = headers
        .iter()
        .filter(|(name, _)| {
            ![
                "date",
                "set-cookie",
                "idempotent-replayed",
                "content-length",
                "connection",
                "keep-alive",
                "transfer-encoding",
            ]
            .contains(&name.as_str())
        })
        .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
        .collect::<Vec<_>>();
    // Field lines with different names carry no order (RFC 9110 §5.3), and
    // actix-web keeps its header map in hash order; the lines of one name do,
    // so the sort is stable.
    replayable.sort_by(|a, b| a.0.cmp(&b.0));
    replayable
}

/// Sends raw bytes and reads the answer until the server closes.
pub async fn raw(url: &str, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(url.trim_start_matches("http://"))
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
pub async fn eventually<F, Fut>(what: &str, mut check: F)
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
