//! Hostile requests at the HTTP layer, sent as raw bytes over TCP:
//! malformed and duplicated headers, bodies over the limit, slow and
//! aborted uploads, non-UTF-8 bodies, huge header values. Each gets the
//! right 4xx, the handler never runs for it, nothing panics and the server
//! keeps serving. Also the security cases: tenants never see each other's
//! outcomes, and a retry that swaps the amount is refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use idem_core::MemoryStore;
use idem_tower::IdempotencyLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Server {
    addr: std::net::SocketAddr,
    runs: Arc<AtomicUsize>,
}

async fn serve() -> Server {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .with_max_request_body(1024)
        .with_scope(|parts| {
            parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });
    let app = Router::new()
        .route(
            "/payments",
            post(move |body: axum::body::Bytes| {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    let text = format!("charge {n} for {} bytes", body.len());
                    (http::StatusCode::CREATED, text)
                }
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server { addr, runs }
}

impl Server {
    /// Sends raw bytes and reads the response's status (0 when the server
    /// closed the connection without one).
    async fn raw(&self, request: &[u8]) -> (u16, String) {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut response = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            let mut buf = [0u8; 4096];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        response.extend_from_slice(&buf[..n]);
                        if complete(&response) {
                            break;
                        }
                    }
                }
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "the server hung on {:?}",
            String::from_utf8_lossy(request)
        );
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, text)
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    async fn still_serving(&self) {
        let key = format!("alive-{}", rand::random::<u64>());
        let (status, _) = self
            .raw(&post_bytes(&[("Idempotency-Key", &key)], b"{}"))
            .await;
        assert_eq!(status, 201, "the server stopped serving");
    }
}

/// A complete response: headers and a body of the stated length.
fn complete(response: &[u8]) -> bool {
    let text = String::from_utf8_lossy(response);
    let Some(end) = text.find("\r\n\r\n") else {
        return false;
    };
    let length = text[..end]
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    response.len() >= end + 4 + length
}

fn post_bytes(headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut request = b"POST /payments HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\n".to_vec();
    for (name, value) in headers {
        request.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    request
}

#[tokio::test]
async fn malformed_keys_are_400_and_never_run_the_handler() {
    let server = serve().await;
    let long = "k".repeat(256);
    let cases: Vec<Vec<u8>> = vec![
        post_bytes(&[("Idempotency-Key", "")], b"{}"),
        post_bytes(&[("Idempotency-Key", &long)], b"{}"),
        post_bytes(&[("Idempotency-Key", "\"unterminated")], b"{}"),
        post_bytes(&[("Idempotency-Key", "\"abc\";param=1")], b"{}"),
        post_bytes(&[("Idempotency-Key", "has space")], b"{}"),
        post_bytes(&[("Idempotency-Key", "a"), ("Idempotency-Key", "b")], b"{}"),
        [&b"POST /payments HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: caf\xc3\xa9\r\nContent-Length: 2\r\n\r\n{}"[..]].concat(),
    ];
    for request in cases {
        let (status, text) = server.raw(&request).await;
        assert_eq!(
            status,
            400,
            "{:?} -> {text}",
            String::from_utf8_lossy(&request)
        );
        assert!(text.contains("application/problem+json"), "{text}");
    }
    assert_eq!(server.runs(), 0);
    server.still_serving().await;
}

#[tokio::test]
async fn huge_header_values_are_refused_without_running_the_handler() {
    let server = serve().await;
    let huge = "x".repeat(512 * 1024);
    let (status, _) = server
        .raw(&post_bytes(&[("Idempotency-Key", &huge)], b"{}"))
        .await;
    assert!((400..500).contains(&status) || status == 0, "got {status}");
    let (status, _) = server
        .raw(&post_bytes(
            &[("Idempotency-Key", "ok-key"), ("X-Junk", &huge)],
            b"{}",
        ))
        .await;
    assert!((400..500).contains(&status) || status == 0, "got {status}");
    assert_eq!(server.runs(), 0);
    server.still_serving().await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_the_key_stays_usable() {
    let server = serve().await;
    let big = vec![b'a'; 4096];
    let (status, text) = server
        .raw(&post_bytes(&[("Idempotency-Key", "big")], &big))
        .await;
    assert_eq!(status, 413, "{text}");
    assert_eq!(server.runs(), 0);
    let (status, _) = server
        .raw(&post_bytes(&[("Idempotency-Key", "big")], b"{}"))
        .await;
    assert_eq!(status, 201, "a refused body must not burn its key");
}

#[tokio::test]
async fn an_aborted_upload_runs_nothing_and_a_slow_one_still_completes() {
    let server = serve().await;
    // Aborted: the client promises 1000 bytes, sends 10 and hangs up.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /payments HTTP/1.1\r\nHost: t\r\nIdempotency-Key: aborted\r\nContent-Length: 1000\r\n\r\n0123456789")
        .await
        .unwrap();
    drop(stream);
    // Slow: the body arrives in pieces.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /payments HTTP/1.1\r\nHost: t\r\nConnection: close\r\nIdempotency-Key: slow\r\nContent-Length: 30\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        stream.write_all(b"0123456789").await.unwrap();
    }
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    assert_eq!(server.runs(), 1, "the aborted upload must not have run");
    // The aborted key was never claimed, or was released: it runs now.
    let (status, _) = server
        .raw(&post_bytes(&[("Idempotency-Key", "aborted")], b"{}"))
        .await;
    assert_eq!(status, 201);
    server.still_serving().await;
}

#[tokio::test]
async fn non_utf8_bodies_are_fingerprinted_as_bytes_and_replayed() {
    let server = serve().await;
    let body = b"\xff\xfe\x00binary\x80";
    let first = server
        .raw(&post_bytes(&[("Idempotency-Key", "bin")], body))
        .await;
    let second = server
        .raw(&post_bytes(&[("Idempotency-Key", "bin")], body))
        .await;
    assert_eq!((first.0, second.0), (201, 201));
    assert!(second
        .1
        .to_ascii_lowercase()
        .contains("idempotent-replayed: true"));
    let other = server
        .raw(&post_bytes(
            &[("Idempotency-Key", "bin")],
            b"\xff\xfe\x00binary\x81",
        ))
        .await;
    assert_eq!(other.0, 422);
    assert_eq!(server.runs(), 1);
}

#[tokio::test]
async fn two_tenants_with_the_same_key_and_body_never_see_each_others_outcome() {
    let server = serve().await;
    let alice = server
        .raw(&post_bytes(
            &[("Idempotency-Key", "k1"), ("X-Tenant", "alice")],
            b"{}",
        ))
        .await;
    let bob = server
        .raw(&post_bytes(
            &[("Idempotency-Key", "k1"), ("X-Tenant", "bob")],
            b"{}",
        ))
        .await;
    assert_eq!((alice.0, bob.0), (201, 201));
    assert!(alice.1.contains("charge 1"), "{}", alice.1);
    assert!(bob.1.contains("charge 2"), "{}", bob.1);
    // Bob guessing Alice's key gets only his own outcome.
    let guess = server
        .raw(&post_bytes(
            &[("Idempotency-Key", "k1"), ("X-Tenant", "bob")],
            b"{}",
        ))
        .await;
    assert!(guess.1.contains("charge 2") && !guess.1.contains("charge 1"));
    assert_eq!(server.runs(), 2);
}

#[tokio::test]
async fn a_retry_that_swaps_the_amount_is_refused_and_the_original_charge_stands() {
    let server = serve().await;
    let original = server
        .raw(&post_bytes(
            &[("Idempotency-Key", "pay-1")],
            br#"{"amount":1250,"currency":"EUR"}"#,
        ))
        .await;
    assert_eq!(original.0, 201);
    let swapped = server
        .raw(&post_bytes(
            &[("Idempotency-Key", "pay-1")],
            br#"{"amount":999999,"currency":"EUR"}"#,
        ))
        .await;
    assert_eq!(swapped.0, 422, "{}", swapped.1);
    let replay = server
        .raw(&post_bytes(
            &[("Idempotency-Key", "pay-1")],
            br#"{"amount":1250,"currency":"EUR"}"#,
        ))
        .await;
    assert_eq!(replay.0, 201);
    let body = |text: &str| text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    assert_eq!(
        body(&replay.1),
        body(&original.1),
        "the original charge must stand"
    );
    assert_eq!(server.runs(), 1);
}
