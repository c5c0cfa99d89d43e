//! The payments API's answers, over real HTTP, with the idempotency layer
//! and a SQLite store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use idem_demo::{Charge, RunningServer};
use idem_sqlite::SqliteStore;
use serde_json::Value;

struct Api {
    server: RunningServer,
    client: Client<HttpConnector, Full<Bytes>>,
    _dir: tempfile::TempDir,
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn is_problem(&self) -> bool {
        self.headers.get(header::CONTENT_TYPE).unwrap() == "application/problem+json"
    }

    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

impl Api {
    async fn start() -> Api {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("api.db")).await.unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = RunningServer::start(addr, Arc::new(store), Duration::from_millis(2))
            .await
            .unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http();
        Api {
            server,
            client,
            _dir: dir,
        }
    }

    async fn send(&self, method: Method, path: &str, key: Option<&str>, body: &str) -> Answer {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.server.url()))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = self.client.request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    async fn pay(&self, key: &str, body: &str) -> Answer {
        self.send(Method::POST, "/payments", Some(key), body).await
    }
}

const EUR_1250: &str = r#"{"amount": 1250, "currency": "EUR"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_is_charged_once_and_its_retry_replays_the_same_charge() {
    let api = Api::start().await;
    let first = api.pay("order-1", EUR_1250).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let charge: Charge = serde_json::from_slice(&first.body).unwrap();
    assert_eq!((charge.amount, charge.currency.as_str()), (1250, "EUR"));
    assert_eq!(charge.idempotency_key, "order-1");
    assert!(charge.id.starts_with("ch_"));
    assert!(charge.created_at.ends_with('Z'), "{}", charge.created_at);

    let retry = api.pay("order-1", EUR_1250).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "a retry must say it is a replay");
    assert_eq!(
        retry.body, first.body,
        "a replay is byte for byte the first answer"
    );
    assert_eq!(api.server.ledger().charges(), vec![charge]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_body_is_refused_with_422() {
    let api = Api::start().await;
    assert_eq!(
        api.pay("order-2", EUR_1250).await.status,
        StatusCode::CREATED
    );
    let altered = api
        .pay("order-2", r#"{"amount": 1251, "currency": "EUR"}"#)
        .await;
    assert_eq!(altered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(altered.is_problem());
    assert_eq!(
        api.server.ledger().len(),
        1,
        "the altered body charged nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_payments_are_refused_with_400_and_charge_nothing() {
    let api = Api::start().await;
    let malformed = [
        "not json",
        r#"{"amount": "1250", "currency": "EUR"}"#,
        r#"{"amount": 12.5, "currency": "EUR"}"#,
        r#"{"currency": "EUR"}"#,
        r#"{"amount": 1250, "currency": "EUR", "tip": 5}"#,
    ];
    for (i, body) in malformed.iter().enumerate() {
        let answer = api.pay(&format!("malformed-{i}"), body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(answer.is_problem(), "{body}");
        assert_eq!(answer.json()["status"], 400);
    }
    assert!(api.server.ledger().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_with_invalid_values_are_refused_with_422_and_charge_nothing() {
    let api = Api::start().await;
    let invalid = [
        r#"{"amount": 0, "currency": "EUR"}"#,
        r#"{"amount": -5, "currency": "EUR"}"#,
        r#"{"amount": 1250, "currency": "eur"}"#,
        r#"{"amount": 1250, "currency": "EURO"}"#,
    ];
    for (i, body) in invalid.iter().enumerate() {
        let answer = api.pay(&format!("invalid-{i}"), body).await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(answer.is_problem(), "{body}");
        assert_eq!(
            answer.json()["type"],
            "tag:idem-rs.github.io,2025:demo/invalid-payment"
        );
    }
    assert!(api.server.ledger().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_without_an_idempotency_key_is_refused_with_400() {
    let api = Api::start().await;
    let answer = api.send(Method::POST, "/payments", None, EUR_1250).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert!(answer.is_problem());
    assert!(api.server.ledger().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_charge_once() {
    let api = Arc::new(Api::start().await);
    let racers = (0..12).map(|_| {
        let api = Arc::clone(&api);
        tokio::spawn(async move { api.pay("order-race", EUR_1250).await })
    });
    let mut created = 0;
    for racer in racers {
        let answer = racer.await.unwrap();
        match answer.status {
            StatusCode::CREATED if !answer.replayed() => created += 1,
            StatusCode::CREATED | StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(created, 1, "exactly one racer ran the handler");
    assert_eq!(api.server.ledger().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_shows_every_charge_made_and_health_is_ok() {
    let api = Api::start().await;
    api.pay("order-a", EUR_1250).await;
    api.pay("order-b", r#"{"amount": 99, "currency": "JPY"}"#)
        .await;
    let list = api.send(Method::GET, "/payments", None, "").await;
    assert_eq!(list.status, StatusCode::OK);
    let keys: Vec<String> = list.json()["charges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["idempotency_key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["order-a", "order-b"]);

    let health = api.send(Method::GET, "/healthz", None, "").await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json()["status"], "ok");
}

// Pins the Idempotency-Key draft's promise that a retry after a dropped
// connection gets the outcome: a client that hangs up at any point of its
// request must not leave its key blocked (409) until the lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_request_can_retry_at_once() {
    let api = Api::start().await;
    for i in 0..24_u64 {
        let key = format!("hang-up-{i}");
        // Hanging up after 0–5 ms lands before, during and after the claim
        // and the handler's simulated gateway call.
        let hang_up = Duration::from_micros(250 * (i % 20));
        let _ = tokio::time::timeout(hang_up, api.pay(&key, EUR_1250)).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let answer = api.pay(&key, EUR_1250).await;
            if answer.status == StatusCode::CREATED {
                break;
            }
            assert_eq!(answer.status, StatusCode::CONFLICT, "{key}");
            assert!(
                tokio::time::Instant::now() < deadline,
                "{key} is still in progress 5 s after its client hung up"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let charges = api.server.ledger().charges();
    assert_eq!(charges.len(), 24, "one charge per key");
}
