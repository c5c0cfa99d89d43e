//! idem-client over TLS: the payments API served over rustls with a test
//! CA, called by a client given that CA through reqwest's builder. A call
//! sent again under its key replays; a client trusting another CA fails
//! in the handshake, before any request reaches the server.

#![cfg(feature = "rustls-tls")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use http::StatusCode;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use idem_client::{Error, Failure, IdemClient, RetryPolicy};
use idem_core::MemoryStore;
use idem_demo::{Charge, Gateway};
use idem_testing::tls::{self, Certs, ServerCert};
use serde_json::json;
use tokio::net::TcpListener;

/// The payments API over TLS on a free port: its URL by name (so the
/// certificate's host is checked), its ledger, and the count of HTTP
/// requests that reached it.
async fn https_server(certs: &Certs) -> (String, Arc<Gateway>, Arc<AtomicUsize>) {
    let gateway = Arc::new(Gateway::new(Duration::ZERO));
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    let router = idem_demo::router(Arc::new(MemoryStore::new()), Arc::clone(&gateway)).layer(
        axum::middleware::from_fn(move |request: Request, next: Next| {
            counted.fetch_add(1, Ordering::SeqCst);
            next.run(request)
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = tls::rustls_server_config(certs, ServerCert::Good);
    tls::serve_tls(listener, config, move |stream| {
        let router = router.clone();
        async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
                .await;
        }
    });
    (format!("https://localhost:{port}"), gateway, requests)
}

/// The payments API over TLS with certificates made for it, called by an
/// idem client that trusts one CA of them and no other root.
struct Setup {
    client: IdemClient,
    url: String,
    gateway: Arc<Gateway>,
    requests: Arc<AtomicUsize>,
    /// The certificates, removed when the test ends.
    _dir: tempfile::TempDir,
}

/// The client trusts the CA in `ca` (`ca.pem`, `other-ca.pem`).
async fn setup(ca: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::new(dir.path());
    let (url, gateway, requests) = https_server(&certs).await;
    let pem = std::fs::read(certs.path(ca)).unwrap();
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    Setup {
        client: IdemClient::from_reqwest(http),
        url,
        gateway,
        requests,
        _dir: dir,
    }
}

#[tokio::test]
async fn an_https_api_is_called_and_a_call_sent_again_replays() {
    let api = setup("ca.pem").await;
    let body = json!({ "amount": 1250, "currency": "EUR" });
    let send = || {
        api.client
            .post(format!("{}/payments", api.url))
            .key("tls-order-1")
            .json(&body)
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED, "{}", first.text());
    assert!(!first.replayed());
    let again = send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(
        again.json::<Charge>().unwrap(),
        first.json::<Charge>().unwrap()
    );
    assert_eq!(api.gateway.ledger().len(), 1);
    assert_eq!(api.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_client_trusting_another_ca_fails_before_any_request_is_sent() {
    let api = setup("other-ca.pem").await;
    let failed = api
        .client
        .post(format!("{}/payments", api.url))
        .key("tls-order-2")
        .json(&json!({ "amount": 1250, "currency": "EUR" }))
        .retry(
            RetryPolicy::default()
                .with_max_attempts(2)
                .with_backoff(Duration::from_millis(1), Duration::from_millis(1)),
        )
        .send()
        .await
        .unwrap_err();
    let Error::GaveUp { last, .. } = &failed else {
        panic!("{failed:?}");
    };
    let Failure::Transport(error) = &**last else {
        panic!("{last:?}");
    };
    assert!(error.is_connect(), "{error:?}");
    // The cause is in the error's chain: the certificate's issuer.
    let mut chain = String::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = next {
        chain.push_str(&format!("{error}; "));
        // An `io::Error`'s own source skips the error it wraps.
        next = match error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    assert!(chain.contains("UnknownIssuer"), "{chain}");
    assert_eq!(api.requests.load(Ordering::SeqCst), 0);
    assert_eq!(api.gateway.ledger().len(), 0);
}
