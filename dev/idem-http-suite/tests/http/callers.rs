//! Whose key it is: with no scope set, a key belongs to its caller (the
//! `Authorization` header, hashed), on every adapter.

use idem_http_suite::{on_every_adapter_and_backend, post, problem, Adapter, Backend, BODY};

/// Sends the suite's payment under `key`, as `authorization` (none for an
/// anonymous request); answers the status and whether it was a replay.
async fn pay(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    authorization: Option<&str>,
) -> (u16, bool) {
    let mut request = post(client, &format!("{url}/payments"), Some(key), BODY);
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (response.status().as_u16(), replayed)
}

const ALICE: Option<&str> = Some("Bearer alice-token");
const BOB: Option<&str> = Some("Bearer bob-token");

#[tokio::test]
async fn another_caller_with_the_same_key_and_body_runs_as_a_new_request() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        assert_eq!(pay(&client, &url, "order-1", ALICE).await, (201, false));
        assert_eq!(pay(&client, &url, "order-1", ALICE).await, (201, true));
        assert_eq!(handlers.runs(), 1, "the same caller's retry replays");
        assert_eq!(pay(&client, &url, "order-1", BOB).await, (201, false));
        assert_eq!(handlers.runs(), 2, "another caller runs as a new request");
        assert_eq!(pay(&client, &url, "order-1", BOB).await, (201, true));
        assert_eq!(handlers.runs(), 2);
    })
    .await;
}

#[tokio::test]
async fn anonymous_and_authenticated_callers_never_replay_each_other() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        assert_eq!(pay(&client, &url, "order-1", ALICE).await, (201, false));
        assert_eq!(pay(&client, &url, "order-1", None).await, (201, false));
        assert_eq!(
            handlers.runs(),
            2,
            "an anonymous request never replays a caller's"
        );
        assert_eq!(pay(&client, &url, "order-1", None).await, (201, true));
        assert_eq!(
            handlers.runs(),
            2,
            "an anonymous retry replays the anonymous record"
        );
        assert_eq!(pay(&client, &url, "order-2", None).await, (201, false));
        assert_eq!(pay(&client, &url, "order-2", BOB).await, (201, false));
        assert_eq!(
            handlers.runs(),
            4,
            "a caller never replays an anonymous record"
        );
    })
    .await;
}

#[tokio::test]
async fn shared_across_callers_lets_callers_share_a_key() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let options = backend.options().shared_across_callers();
        let (url, handlers) = adapter.start(options).await;
        let client = reqwest::Client::new();
        assert_eq!(pay(&client, &url, "order-1", ALICE).await, (201, false));
        assert_eq!(pay(&client, &url, "order-1", BOB).await, (201, true));
        assert_eq!(pay(&client, &url, "order-1", None).await, (201, true));
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_record_from_before_callers_were_told_apart_is_neither_replayed_nor_run_again() {
    // Pins the upgrade: a record in no scope (what an earlier build wrote,
    // byte for byte, as keys shared across callers still do) is refused to
    // every caller, since its own caller is unknown.
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let options = backend.options();
        let (earlier, before) = adapter.start(options.clone().shared_across_callers()).await;
        let (url, handlers) = adapter.start(options).await;
        let client = reqwest::Client::new();
        assert_eq!(pay(&client, &earlier, "order-1", ALICE).await, (201, false));
        assert_eq!(before.runs(), 1);
        for caller in [ALICE, BOB, None] {
            let mut request = post(&client, &format!("{url}/payments"), Some("order-1"), BODY);
            if let Some(value) = caller {
                request = request.header("authorization", value);
            }
            let response = request.send().await.unwrap();
            assert_eq!(problem(response, 409).await, "not-replayable");
        }
        // Another request under the key is no retry of it, and runs.
        let other = post(&client, &format!("{url}/payments"), Some("order-1"), "{}")
            .header("authorization", "Bearer bob-token")
            .send()
            .await
            .unwrap();
        assert_eq!(other.status(), 201);
        assert_eq!(handlers.runs(), 1);
        assert_eq!(before.runs(), 1);
    })
    .await;
}
