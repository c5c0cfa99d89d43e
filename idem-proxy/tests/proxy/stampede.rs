//! Many keys, each sent by many clients at once: one upstream call a key.

use std::collections::HashMap;

use futures_util::stream::{self, StreamExt};
use idem_core::Idempotent;
use idem_http::Options;
use idem_proxy::Route;

use crate::support::{builder, python, serve, sqlite};

/// Keys, and the duplicates of each sent at once; heavier with
/// `IDEM_PROXY_STAMPEDE_KEYS`.
const DUPLICATES: usize = 20;

fn keys() -> usize {
    std::env::var("IDEM_PROXY_STAMPEDE_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stampede_of_duplicates_reaches_the_upstream_once_a_key() {
    let Some(upstream) = python() else { return };
    let (store, _dir) = sqlite().await;
    let route = Route::new(Options::from_idempotent(Idempotent::from_arc(store)));
    let (url, _stop) = serve(builder(&upstream, route)).await;
    let client = reqwest::Client::new();
    let keys = keys();
    // Key by key, so a key's duplicates are in flight together; those
    // that find it in flight wait for its answer (`Prefer: wait`).
    let requests = (0..keys).flat_map(|k| (0..DUPLICATES).map(move |_| k));
    let answers: Vec<(usize, u16, String)> = stream::iter(requests)
        .map(|k| {
            let client = client.clone();
            let url = format!("{url}/payments");
            async move {
                let answer = client
                    .post(url)
                    .header("idempotency-key", format!("stampede-{k}"))
                    .header("content-type", "application/json")
                    .header("prefer", "wait=30")
                    .body(format!(r#"{{"amount":{k}}}"#))
                    .send()
                    .await
                    .unwrap();
                let status = answer.status().as_u16();
                (k, status, answer.text().await.unwrap())
            }
        })
        .buffer_unordered(4 * DUPLICATES)
        .collect()
        .await;
    let mut bodies: HashMap<usize, Vec<String>> = HashMap::new();
    for (k, status, body) in answers {
        assert_eq!(status, 201, "key {k}: {body}");
        bodies.entry(k).or_default().push(body);
    }
    for (k, bodies) in &bodies {
        assert_eq!(bodies.len(), DUPLICATES);
        assert!(
            bodies.iter().all(|b| b == &bodies[0]),
            "key {k}: {bodies:?}"
        );
    }
    let log = upstream.log();
    let mut calls: HashMap<String, usize> = HashMap::new();
    for run in &log {
        *calls
            .entry(run.key.clone().unwrap_or_default())
            .or_default() += 1;
    }
    let duplicated: Vec<_> = calls.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicated.is_empty(), "keys called twice: {duplicated:?}");
    assert_eq!(log.len(), keys);
}
