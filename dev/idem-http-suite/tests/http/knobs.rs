//! What the fingerprint covers and where the key comes from: route
//! policies, form and multipart bodies, keys in the body or found by a
//! function.

use idem_http::{FingerprintPolicy, KeySource};
use idem_http_suite::{on_every_adapter_and_backend, problem, Adapter, Backend};
use reqwest::header::CONTENT_TYPE;

/// Whether the adapter's options can carry Rust values (a policy, a key
/// source); the FastAPI and Express apps' are made in their own processes,
/// and idem-python's tests/test_asgi.py and idem-node's tests test their
/// policies there.
fn takes_rust_values(adapter: Adapter) -> bool {
    !adapter.opens_its_store_by_url()
}

/// Sends `body` as `content_type` with `key` (if any) and returns the
/// status, whether it was a replay, and the body.
async fn send(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    content_type: &str,
    body: String,
) -> (u16, bool, String) {
    let mut request = client
        .post(url)
        .header(CONTENT_TYPE, content_type)
        .body(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.unwrap();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (
        response.status().as_u16(),
        replayed,
        response.text().await.unwrap(),
    )
}

#[tokio::test]
async fn a_route_policy_replays_retries_that_differ_only_in_what_it_leaves_out() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        if !takes_rust_values(adapter) {
            return;
        }
        let policy = FingerprintPolicy::new()
            .exclude(["/client_ts"])
            .ignore_query_params(["attempt"]);
        let options = backend
            .options()
            .with_route_fingerprint_policy("/payments", policy);
        let (url, handlers) = adapter.start(options).await;
        let client = reqwest::Client::new();
        let json = "application/json";
        let payments = |attempt: u32| format!("{url}/payments?attempt={attempt}");
        let first = send(
            &client,
            &payments(1),
            Some("p-1"),
            json,
            r#"{"amount":1250,"client_ts":1}"#.into(),
        )
        .await;
        assert_eq!((first.0, first.1), (201, false));
        let retry = send(
            &client,
            &payments(2),
            Some("p-1"),
            json,
            r#"{ "client_ts": 2, "amount": 1250 }"#.into(),
        )
        .await;
        assert_eq!(
            retry,
            (201, true, first.2.clone()),
            "an honest retry replays"
        );
        let response = client
            .post(payments(3))
            .header(CONTENT_TYPE, json)
            .header("idempotency-key", "p-1")
            .body(r#"{"amount":1251,"client_ts":1}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(problem(response, 422).await, "mismatch", "a changed amount");
        // Another route has no policy: the whole body counts.
        let other = format!("{url}/other");
        send(
            &client,
            &other,
            Some("o-1"),
            json,
            r#"{"amount":1,"client_ts":1}"#.into(),
        )
        .await;
        let again = send(
            &client,
            &other,
            Some("o-1"),
            json,
            r#"{"amount":1,"client_ts":2}"#.into(),
        )
        .await;
        assert_eq!(again.0, 422);
        assert_eq!(handlers.runs(), 2);
    })
    .await;
}

#[tokio::test]
async fn form_and_multipart_retries_replay_and_changed_ones_do_not() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let url = format!("{url}/payments");
        let form = "application/x-www-form-urlencoded";
        let first = send(&client, &url, Some("f-1"), form, "amount=1250&currency=EUR&tag=a&tag=b".into()).await;
        assert_eq!((first.0, first.1), (201, false));
        let retry = send(&client, &url, Some("f-1"), form, "tag=a&currency=%45UR&tag=b&amount=1250".into()).await;
        assert_eq!(retry, (201, true, first.2.clone()));
        let changed = send(&client, &url, Some("f-1"), form, "amount=1250&currency=EUR&tag=b&tag=a".into()).await;
        assert_eq!(changed.0, 422, "one name's values in another order");

        let multipart = |boundary: &str, data: &str| {
            (
                format!("multipart/form-data; boundary={boundary}"),
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi\r\n\
                     --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\
                     Content-Type: text/plain\r\n\r\n{data}\r\n--{boundary}--\r\n"
                ),
            )
        };
        let (ct, body) = multipart("first-boundary", "file bytes");
        let first = send(&client, &url, Some("m-1"), &ct, body).await;
        assert_eq!((first.0, first.1), (201, false));
        let (ct, body) = multipart("a-new-boundary", "file bytes");
        let retry = send(&client, &url, Some("m-1"), &ct, body).await;
        assert_eq!(retry, (201, true, first.2.clone()), "a new boundary replays");
        let (ct, body) = multipart("a-new-boundary", "other bytes");
        assert_eq!(send(&client, &url, Some("m-1"), &ct, body).await.0, 422, "another file");
        assert_eq!(handlers.runs(), 2);
    })
    .await;
}

#[tokio::test]
async fn the_key_can_come_from_a_json_pointer_into_the_body() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        if !takes_rust_values(adapter) {
            return;
        }
        let options = backend
            .options()
            .with_key_source(KeySource::json_pointer("/request_id"))
            .require_key(true);
        let (url, handlers) = adapter.start(options).await;
        let client = reqwest::Client::new();
        let url = format!("{url}/payments");
        let json = "application/json";
        let body = r#"{"request_id":"req-1","amount":1250}"#;
        let first = send(&client, &url, None, json, body.into()).await;
        assert_eq!((first.0, first.1), (201, false));
        let retry = send(
            &client,
            &url,
            None,
            json,
            r#"{"amount":1250,"request_id":"req-1"}"#.into(),
        )
        .await;
        assert_eq!(retry, (201, true, first.2.clone()));
        let changed = send(
            &client,
            &url,
            None,
            json,
            r#"{"request_id":"req-1","amount":1}"#.into(),
        )
        .await;
        assert_eq!(changed.0, 422);
        let response = client
            .post(&url)
            .header(CONTENT_TYPE, json)
            .header("idempotency-key", "in-a-header")
            .body(r#"{"amount":1250}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(
            problem(response, 400).await,
            "missing-key",
            "the header is not read"
        );
        let response = client
            .post(&url)
            .header(CONTENT_TYPE, json)
            .body(r#"{"request_id":12}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(problem(response, 400).await, "invalid-key");
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn the_key_can_come_from_a_function_over_the_request() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        if !takes_rust_values(adapter) {
            return;
        }
        // An operation id in the path names the operation.
        let source = KeySource::function(|_, uri, _, _| {
            uri.query()?
                .split('&')
                .find_map(|pair| pair.strip_prefix("op="))
                .map(str::to_owned)
        });
        let (url, handlers) = adapter
            .start(backend.options().with_key_source(source))
            .await;
        let client = reqwest::Client::new();
        let json = "application/json";
        let url = format!("{url}/payments?op=op-7");
        let first = send(&client, &url, None, json, r#"{"amount":1}"#.into()).await;
        let retry = send(&client, &url, None, json, r#"{"amount":1}"#.into()).await;
        assert_eq!((first.0, first.1), (201, false));
        assert_eq!(retry, (201, true, first.2.clone()));
        // Without an operation id the request is not protected.
        let plain = url.replace("?op=op-7", "");
        send(&client, &plain, None, json, r#"{"amount":1}"#.into()).await;
        let unprotected = send(&client, &plain, None, json, r#"{"amount":1}"#.into()).await;
        assert_eq!((unprotected.0, unprotected.1), (201, false));
        assert_eq!(handlers.runs(), 3);
    })
    .await;
}
