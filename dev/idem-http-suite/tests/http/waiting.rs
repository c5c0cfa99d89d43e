//! `Prefer: wait=N` (RFC 7240): a request whose key is in progress waits
//! for the original's response instead of a 409, up to the layer's cap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::Idempotent;
use idem_http::Options;
use idem_http_suite::{
    eventually, on_every_adapter_and_backend, post, problem, Adapter, Backend, BODY,
};
use idem_testing::unique_name;
use idem_testing::waiting::CountingStore;

/// Options over the backend's store, counting its claims.
fn counted(backend: &Backend) -> (Options, CountingStore) {
    let counting = CountingStore::new(Arc::clone(&backend.store));
    let idem = Idempotent::new(counting.clone()).with_namespace(unique_name("idem-http-wait"));
    (Options::from_idempotent(idem), counting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_prefers_to_wait_gets_the_originals_response_instead_of_409() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        // The counting store lives in this process; the FastAPI and
        // Express apps' are their own (idem-python's tests/test_asgi.py
        // waits there).
        if adapter.opens_its_store_by_url() {
            return;
        }
        let (options, counting) = counted(&backend);
        let (url, handlers) = adapter.start(options).await;
        let client = reqwest::Client::new();
        let gated = format!("{url}/gated");
        let original = tokio::spawn(post(&client, &gated, Some("w"), BODY).send());
        eventually("the gated handler runs", || async { handlers.runs() == 1 }).await;
        let waiter = tokio::spawn(
            post(&client, &gated, Some("w"), BODY)
                .header("prefer", "respond-async, wait=30")
                .send(),
        );
        // The original's claim, the waiter's claim that found the key in
        // progress, then its waiting claim, all answered: now it waits.
        eventually("the request waits", || async { counting.answered() >= 3 }).await;
        handlers.open_gate();

        let original = original.await.unwrap().unwrap();
        assert_eq!(original.status(), 201);
        assert!(original.headers().get("preference-applied").is_none());
        assert_eq!(original.text().await.unwrap(), "run 1");
        let waited = waiter.await.unwrap().unwrap();
        assert_eq!(waited.status(), 201);
        assert_eq!(waited.headers()["preference-applied"], "wait");
        assert_eq!(waited.headers()["idempotent-replayed"], "true");
        assert_eq!(waited.text().await.unwrap(), "run 1");
        assert_eq!(handlers.runs(), 1, "the handler ran once");

        // A later replay is unchanged by the preference it does not need.
        let replay = post(&client, &gated, Some("w"), BODY)
            .header("prefer", "wait=30")
            .send()
            .await
            .unwrap();
        assert_eq!(replay.status(), 201);
        assert!(replay.headers().get("preference-applied").is_none());
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_is_capped_by_the_layer_and_then_answered_409() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let cap = Duration::from_millis(600);
        let options = backend.options();
        let (url, handlers) = adapter.start(options.with_max_wait(cap)).await;
        let client = reqwest::Client::new();
        let gated = format!("{url}/gated");
        let original = tokio::spawn(post(&client, &gated, Some("c"), BODY).send());
        eventually("the gated handler runs", || async { handlers.runs() == 1 }).await;

        // Without the preference, or with wait=0: 409 at once, as before.
        for prefer in [None, Some("wait=0"), Some("wait=soon")] {
            let mut request = post(&client, &gated, Some("c"), BODY);
            if let Some(prefer) = prefer {
                request = request.header("prefer", prefer);
            }
            let response = request.send().await.unwrap();
            assert!(response.headers().get("preference-applied").is_none());
            assert_eq!(problem(response, 409).await, "in-progress", "{prefer:?}");
        }

        // The client asks for an hour; the layer's cap ends the wait.
        let start = Instant::now();
        let response = post(&client, &gated, Some("c"), BODY)
            .header("prefer", "wait=3600")
            .send()
            .await
            .unwrap();
        let took = start.elapsed();
        assert_eq!(response.headers()["preference-applied"], "wait");
        assert_eq!(problem(response, 409).await, "in-progress");
        assert!(took >= cap, "answered before the cap: {took:?}");
        assert_eq!(handlers.runs(), 1);

        handlers.open_gate();
        assert_eq!(original.await.unwrap().unwrap().status(), 201);
    })
    .await;
}
