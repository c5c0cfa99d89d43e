//! One store behind two adapters: what one records, the other replays,
//! between idem-tower and idem-actix, and between any two of idem-tower,
//! the `idempotence` package's ASGI middleware (Python) and the
//! `idempotence` npm package's Express middleware (Node).

use idem_http_suite::{adapters, backends, post, replayable, Adapter, BODY};
use reqwest::header::HeaderMap;

/// The replayed headers by name, each name's values in their order: actix
/// keeps headers in a hash map, so the order of different names on the
/// wire is the framework's, not the record's.
fn by_name(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut headers = replayable(headers);
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    headers
}

#[tokio::test]
async fn a_response_recorded_through_one_adapter_replays_byte_for_byte_through_the_other() {
    for backend in backends().await {
        println!("backend: {}", backend.name);
        let available = adapters();
        let mut pairs = Vec::new();
        if available.contains(&Adapter::Actix) {
            pairs.extend([
                (Adapter::Tower, Adapter::Actix),
                (Adapter::Actix, Adapter::Tower),
            ]);
        }
        // A FastAPI service behind the ASGI middleware and an axum one
        // behind idem-tower, on one store: not memory, whose records live
        // in this process.
        if available.contains(&Adapter::FastApi) && backend.name != "memory" {
            pairs.extend([
                (Adapter::Tower, Adapter::FastApi),
                (Adapter::FastApi, Adapter::Tower),
            ]);
        }
        // Rust, Python and Node services on one store answer each other's
        // retries.
        if available.contains(&Adapter::Express) && backend.name != "memory" {
            pairs.extend([
                (Adapter::Tower, Adapter::Express),
                (Adapter::Express, Adapter::Tower),
            ]);
            if available.contains(&Adapter::FastApi) {
                pairs.extend([
                    (Adapter::FastApi, Adapter::Express),
                    (Adapter::Express, Adapter::FastApi),
                ]);
            }
        }
        for (first, second) in pairs {
            println!("{first:?} → {second:?}");
            // Both apps share one namespace, so they see the same keys.
            let idem = backend.idem();
            let options = || idem_http::Options::from_idempotent(idem.clone());
            let (url_a, runs_a) = first.start(options()).await;
            let (url_b, runs_b) = second.start(options()).await;
            let client = reqwest::Client::new();
            for path in ["/payments", "/binary"] {
                let send =
                    |url: &str| post(&client, &format!("{url}{path}"), Some(path), BODY).send();
                let original = send(&url_a).await.unwrap();
                let here = send(&url_a).await.unwrap();
                let there = send(&url_b).await.unwrap();
                assert!(original.headers().get("idempotent-replayed").is_none());
                for replay in [&here, &there] {
                    assert_eq!(replay.headers()["idempotent-replayed"], "true");
                    assert_eq!(replay.status(), original.status());
                }
                assert_eq!(by_name(here.headers()), by_name(there.headers()));
                assert_eq!(by_name(original.headers()), by_name(there.headers()));
                let original = original.bytes().await.unwrap();
                assert_eq!(original, here.bytes().await.unwrap());
                assert_eq!(
                    original,
                    there.bytes().await.unwrap(),
                    "{first:?} → {second:?} {path}"
                );
            }
            assert_eq!(runs_a.runs(), 2);
            assert_eq!(runs_b.runs(), 0);
        }
    }
}
