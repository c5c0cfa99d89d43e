//! The header protocol: runs, replays, conflicts, mismatches and refusals.

use std::collections::HashMap;

use futures_util::stream::{FuturesUnordered, StreamExt};
use idem_http_suite::{
    eventually, on_every_adapter_and_backend, post, problem, raw, replayable, Adapter, Backend,
    Scope, BODY,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_posts_with_one_key_run_the_handler_once() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let mut pending: FuturesUnordered<_> = (0..50)
            .map(|_| post(&client, &format!("{url}/gated"), Some("storm-1"), BODY).send())
            .collect();
        // The one request that runs waits at the gate, so the other 49 must
        // all come back as conflicts while it holds the key.
        let mut statuses = HashMap::new();
        for _ in 0..49 {
            let response = pending.next().await.unwrap().unwrap();
            let retry_after: u64 = response.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(retry_after >= 1);
            assert_eq!(problem(response, 409).await, "in-progress");
            *statuses.entry(409).or_insert(0) += 1;
        }
        handlers.open_gate();
        let last = pending.next().await.unwrap().unwrap();
        assert_eq!(last.status(), 201);
        assert_eq!(last.text().await.unwrap(), "run 1");
        assert_eq!(statuses[&409], 49);
        assert_eq!(handlers.runs(), 1);

        let replay = post(&client, &format!("{url}/gated"), Some("storm-1"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(replay.status(), 201);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.text().await.unwrap(), "run 1");
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_replay_is_byte_identical_and_marked_replayed() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        for path in ["/payments", "/binary"] {
            let send = || post(&client, &format!("{url}{path}"), Some(path), BODY).send();
            let first = send().await.unwrap();
            let again = send().await.unwrap();
            assert_eq!(first.status(), again.status());
            assert!(first.headers().get("idempotent-replayed").is_none());
            assert_eq!(again.headers()["idempotent-replayed"], "true");
            assert_eq!(replayable(first.headers()), replayable(again.headers()));
            assert_eq!(first.bytes().await.unwrap(), again.bytes().await.unwrap());
        }
        assert_eq!(handlers.runs(), 2);
    })
    .await;
}

#[tokio::test]
async fn set_cookie_is_sent_to_the_first_caller_and_never_replayed() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, _) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let url = format!("{url}/payments");
        let first = post(&client, &url, Some("cookie"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(first.headers()["set-cookie"], "session=s1; HttpOnly");
        let again = post(&client, &url, Some("cookie"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert!(again.headers().get("set-cookie").is_none());
        assert_eq!(again.headers()["x-run"], "1");
        let multi: Vec<_> = again.headers().get_all("x-multi").iter().collect();
        assert_eq!(multi, ["a", "b"]);
    })
    .await;
}

#[tokio::test]
async fn quoted_and_bare_keys_name_the_same_request() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let url = format!("{url}/payments");
        let first = post(&client, &url, Some("\"order-7f3a\""), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 201);
        let bare = post(&client, &url, Some("order-7f3a"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(bare.headers()["idempotent-replayed"], "true");
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn reusing_a_key_for_another_body_path_or_method_is_422() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let payments = format!("{url}/payments");
        let first = post(&client, &payments, Some("reused"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 201);
        let other_body = post(&client, &payments, Some("reused"), r#"{"amount":1}"#);
        let other_path = post(&client, &format!("{url}/other"), Some("reused"), BODY);
        let other_query = post(&client, &format!("{payments}?x=1"), Some("reused"), BODY);
        let other_type = client
            .post(&payments)
            .header("idempotency-key", "reused")
            .header("content-type", "text/plain")
            .body(BODY);
        let second_type_line =
            post(&client, &payments, Some("reused"), BODY).header("content-type", "text/plain");
        let other_method = client
            .patch(&payments)
            .header("idempotency-key", "reused")
            .header("content-type", "application/json")
            .body(BODY);
        for request in [
            other_body,
            other_path,
            other_query,
            other_type,
            second_type_line,
            other_method,
        ] {
            let response = request.send().await.unwrap();
            assert_eq!(problem(response, 422).await, "mismatch");
        }
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_different_request_under_a_key_in_progress_is_422_not_409() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let gated = format!("{url}/gated");
        let running = tokio::spawn(post(&client, &gated, Some("busy"), BODY).send());
        eventually("the gated handler runs", || async { handlers.runs() == 1 }).await;
        let same = post(&client, &gated, Some("busy"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(problem(same, 409).await, "in-progress");
        let other = post(&client, &gated, Some("busy"), "{}")
            .send()
            .await
            .unwrap();
        assert_eq!(problem(other, 422).await, "mismatch");
        handlers.open_gate();
        assert_eq!(running.await.unwrap().unwrap().status(), 201);
    })
    .await;
}

#[tokio::test]
async fn malformed_keys_are_400_and_run_nothing() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let url = format!("{url}/payments");
        let long = "k".repeat(256);
        let bad: [&[u8]; 7] = [
            b"\"abc\";p=1",
            b"",
            long.as_bytes(),
            b"caf\xc3\xa9",
            b"\"a b\"",
            b"\"unterminated",
            b"a, b",
        ];
        for value in bad {
            let response = post(&client, &url, None, BODY)
                .header(
                    "idempotency-key",
                    reqwest::header::HeaderValue::from_bytes(value).unwrap(),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(problem(response, 400).await, "invalid-key", "{value:?}");
        }
        let two_lines = post(&client, &url, Some("a"), BODY).header("idempotency-key", "b");
        assert_eq!(
            problem(two_lines.send().await.unwrap(), 400).await,
            "invalid-key"
        );
        assert_eq!(handlers.runs(), 0);
    })
    .await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_with_or_without_content_length() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let layer = backend.options().with_max_request_body(1024);
        let (url, handlers) = adapter.start(layer).await;
        let client = reqwest::Client::new();
        let large = "x".repeat(2048);
        let sized = post(
            &client,
            &format!("{url}/payments"),
            Some("big-body"),
            &large,
        );
        assert_eq!(
            problem(sized.send().await.unwrap(), 413).await,
            "body-too-large"
        );

        let chunk = "x".repeat(800);
        let chunked = format!(
            "POST /payments HTTP/1.1\r\nhost: test\r\nidempotency-key: chunked\r\n\
             transfer-encoding: chunked\r\nconnection: close\r\n\r\n\
             320\r\n{chunk}\r\n320\r\n{chunk}\r\n0\r\n\r\n"
        );
        let answer = raw(&url, chunked.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(answer.contains("application/problem+json"), "{answer}");

        let fits = post(
            &client,
            &format!("{url}/payments"),
            Some("fits"),
            &"x".repeat(1024),
        );
        assert_eq!(fits.send().await.unwrap().status(), 201);
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn tenants_with_the_same_key_and_body_each_run_once() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter
            .start_scoped(backend.options(), Scope::TenantHeader)
            .await;
        let client = reqwest::Client::new();
        let url = format!("{url}/payments");
        let send = |tenant: &str| {
            post(&client, &url, Some("shared-key"), BODY)
                .header("x-tenant", tenant)
                .send()
        };
        let a = send("tenant-a").await.unwrap().text().await.unwrap();
        let b = send("tenant-b").await.unwrap().text().await.unwrap();
        assert!(a.contains(r#""tenant":"tenant-a""#), "{a}");
        assert!(b.contains(r#""tenant":"tenant-b""#), "{b}");
        assert_eq!(handlers.runs(), 2);
        let again = send("tenant-a").await.unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.text().await.unwrap(), a);
        assert_eq!(handlers.runs(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_request_without_a_key_passes_through_unless_keys_are_required() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        for _ in 0..2 {
            let response = post(&client, &format!("{url}/payments"), None, BODY)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 201);
            assert!(response.headers().get("idempotent-replayed").is_none());
        }
        assert_eq!(handlers.runs(), 2);

        let strict = backend.options().require_key(true);
        let (url, handlers) = adapter.start(strict).await;
        let response = post(&client, &format!("{url}/payments"), None, BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(problem(response, 400).await, "missing-key");
        assert_eq!(handlers.runs(), 0);
    })
    .await;
}

#[tokio::test]
async fn get_passes_through_with_or_without_a_key() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options().require_key(true)).await;
        let client = reqwest::Client::new();
        post(&client, &format!("{url}/payments"), Some("g"), BODY)
            .send()
            .await
            .unwrap();
        for key in [None, Some("g"), Some("not a valid key")] {
            let mut request = client.get(format!("{url}/payments"));
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200);
            assert!(response.headers().get("idempotent-replayed").is_none());
            assert_eq!(response.text().await.unwrap(), handlers.runs().to_string());
        }
    })
    .await;
}

#[tokio::test]
async fn server_errors_release_the_key_by_default() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let send = || post(&client, &format!("{url}/flaky"), Some("flaky"), BODY).send();
        assert_eq!(send().await.unwrap().status(), 503);
        let second = send().await.unwrap();
        assert_eq!(second.status(), 201);
        assert!(second.headers().get("idempotent-replayed").is_none());
        let third = send().await.unwrap();
        assert_eq!(third.headers()["idempotent-replayed"], "true");
        assert_eq!(third.text().await.unwrap(), "run 2");
        assert_eq!(handlers.runs(), 2);
    })
    .await;
}

#[tokio::test]
async fn server_errors_are_replayed_when_the_layer_records_them() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        // No public call of `Options` reveals the setting, so it cannot
        // cross to the FastAPI or Express app's process; idem-python's
        // tests/test_asgi.py and idem-node's test/http.test.js set it there.
        if adapter.opens_its_store_by_url() {
            return;
        }
        let layer = backend.options().record_server_errors(true);
        let (url, handlers) = adapter.start(layer).await;
        let client = reqwest::Client::new();
        let send = || post(&client, &format!("{url}/flaky"), Some("flaky"), BODY).send();
        assert_eq!(send().await.unwrap().status(), 503);
        let again = send().await.unwrap();
        assert_eq!(again.status(), 503);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.text().await.unwrap(), "try again");
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

// Regression: the fingerprint hashed the raw body, so a client whose retry
// re-serialised the same JSON with its fields in another order or other
// whitespace got 422 instead of its payment.
#[tokio::test]
async fn a_retry_that_reserialises_the_same_json_is_a_replay_not_422() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let (url, handlers) = adapter.start(backend.options()).await;
        let client = reqwest::Client::new();
        let url = format!("{url}/payments");
        let first = post(&client, &url, Some("reordered"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 201);
        let first = first.text().await.unwrap();
        let reordered = "{\n  \"currency\": \"EUR\",\n  \"amount\": 1250\n}";
        let again = post(&client, &url, Some("reordered"), reordered)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 201);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.text().await.unwrap(), first);
        let other_amount = post(
            &client,
            &url,
            Some("reordered"),
            r#"{"currency":"EUR","amount":1251}"#,
        );
        assert_eq!(
            problem(other_amount.send().await.unwrap(), 422).await,
            "mismatch"
        );
        // Outside JSON media types the body still counts byte for byte.
        let text = |body: &'static str| {
            client
                .post(&url)
                .header("idempotency-key", "plain")
                .header("content-type", "text/plain")
                .body(body)
                .send()
        };
        assert_eq!(text("a  b").await.unwrap().status(), 201);
        assert_eq!(problem(text("a b").await.unwrap(), 422).await, "mismatch");
        assert_eq!(handlers.runs(), 2);
    })
    .await;
}
