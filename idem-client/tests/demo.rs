//! idem-client against the idem-demo payments API, served in-process over
//! `idem-tower`: racing senders, dropped responses and a reused key, with
//! every charge counted in the server's ledger.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;
use idem_client::{Error, IdemClient, RetryPolicy};
use idem_core::MemoryStore;
use idem_demo::{Charge, RunningServer, DEFAULT_GATEWAY_LATENCY};
use serde_json::json;

async fn server() -> RunningServer {
    RunningServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        Arc::new(MemoryStore::new()),
        DEFAULT_GATEWAY_LATENCY,
    )
    .await
    .expect("the payments API starts")
}

/// The demo answers 409 with `Retry-After: 1` while a payment runs; a
/// payment takes milliseconds, so the cap keeps the retries brisk.
fn client() -> IdemClient {
    IdemClient::new().with_retry(
        RetryPolicy::default()
            .with_max_attempts(20)
            .with_max_elapsed(Duration::from_secs(30))
            .with_backoff(Duration::from_millis(2), Duration::from_millis(50))
            .with_retry_after_cap(Duration::from_millis(50)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_and_dropped_sends_of_each_payment_charge_it_once() {
    let server = server().await;
    let client = client();
    let payments = 24;
    let sends = (0..payments).flat_map(|i| {
        let (client, url) = (client.clone(), format!("{}/payments", server.url()));
        let key = format!("demo-client-{i}");
        let body = json!({ "amount": 1000 + i, "currency": "EUR" });
        // Three senders race for each payment under its one key; the first
        // hangs up after 1 ms on its first try, mid-handler, and retries.
        (0..3).map(move |racer| {
            let (client, url, key, body) = (client.clone(), url.clone(), key.clone(), body.clone());
            async move {
                if racer == 0 {
                    let dropped = client
                        .post(&url)
                        .key(&key)
                        .json(&body)
                        .retry(RetryPolicy::never().with_attempt_timeout(Duration::from_millis(1)))
                        .send()
                        .await;
                    assert!(dropped.is_err() || dropped.as_ref().unwrap().status().is_success());
                }
                let response = client.post(&url).key(&key).json(&body).send().await;
                (key, response)
            }
        })
    });
    let mut created = 0;
    for (key, response) in join_all(sends).await {
        let response = response.unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(
            response.status(),
            StatusCode::CREATED,
            "{key}: {}",
            response.text()
        );
        let charge: Charge = response.json().unwrap();
        assert_eq!(charge.idempotency_key, key);
        created += usize::from(!response.replayed());
    }
    let charges = server.ledger().charges();
    assert_eq!(charges.len(), payments as usize, "{charges:?}");
    let mut keys: Vec<_> = charges.iter().map(|c| c.idempotency_key.clone()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), payments as usize, "a payment was charged twice");
    assert!(
        created <= payments as usize,
        "more first executions than payments"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_key_is_key_reused_and_a_refused_payment_is_final() {
    let server = server().await;
    let client = client();
    let url = format!("{}/payments", server.url());
    let send = |amount: i64, currency: &'static str| {
        client
            .post(&url)
            .key("demo-client-reused")
            .json(&json!({ "amount": amount, "currency": currency }))
            .send()
    };
    let first = send(500, "EUR").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = send(500, "EUR").await.unwrap();
    assert!(again.replayed());
    assert_eq!(again.bytes(), first.bytes());
    let reused = send(501, "EUR").await;
    assert!(matches!(reused, Err(Error::KeyReused { .. })), "{reused:?}");

    // The API's own 422 (a bad currency) is an answer, not key reuse.
    let refused = client
        .post(&url)
        .json(&json!({ "amount": 500, "currency": "euro" }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (refused.status(), refused.attempts()),
        (StatusCode::UNPROCESSABLE_ENTITY, 1)
    );
    assert_eq!(server.ledger().len(), 1);
}
