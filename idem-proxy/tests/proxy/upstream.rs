//! What the proxy does when the upstream fails, and what it passes on.

use std::time::Duration;

use http::{HeaderName, Method};
use idem_core::MemoryStore;
use idem_http::Options;
use idem_proxy::{PathPattern, Proxy, Route, Scope};

use crate::support::{builder, problem, python, serve, until};

fn route() -> Route {
    Route::new(Options::new(MemoryStore::new()))
}

fn post(client: &reqwest::Client, url: &str, key: &str) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":1250}"#)
}

#[tokio::test]
async fn an_upstream_that_drops_the_connection_is_502_and_the_key_is_released() {
    let Some(upstream) = python() else { return };
    let (url, _stop) = serve(builder(&upstream, route())).await;
    let client = reqwest::Client::new();
    let send = || post(&client, &format!("{url}/panic"), "dropped").send();
    assert_eq!(problem(send().await.unwrap(), 502).await, "upstream-failed");
    assert_eq!(upstream.runs(), 1);
    // Released: the retry is forwarded, not refused for a whole lease.
    assert_eq!(problem(send().await.unwrap(), 502).await, "upstream-failed");
    assert_eq!(upstream.runs(), 2);
}

#[tokio::test]
async fn an_upstream_that_is_down_is_502_and_the_key_is_released() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let proxy = Proxy::builder(format!("http://{addr}").parse().unwrap()).route(route());
    let (url, _stop) = serve(proxy).await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let answer = post(&client, &format!("{url}/payments"), "down").send();
        assert_eq!(
            problem(answer.await.unwrap(), 502).await,
            "upstream-unavailable"
        );
    }
    let pass = client.get(format!("{url}/payments")).send().await.unwrap();
    assert_eq!(problem(pass, 502).await, "upstream-unavailable");
}

#[tokio::test]
async fn an_upstream_slower_than_the_timeout_is_504_and_the_key_is_released() {
    let Some(upstream) = python() else { return };
    let options = Options::new(MemoryStore::new());
    let impatient = builder(&upstream, Route::new(options.clone()))
        .upstream_timeout(Duration::from_millis(300));
    let (url, _stop) = serve(impatient).await;
    let client = reqwest::Client::new();
    let slow = post(&client, &format!("{url}/slow"), "slow").header("x-delay", "2");
    assert_eq!(
        problem(slow.send().await.unwrap(), 504).await,
        "upstream-timeout"
    );
    // Released: a retry through a patient proxy on the same store is
    // forwarded (the delay is a header, not part of the fingerprint).
    let (patient, _stop) = serve(builder(&upstream, Route::new(options))).await;
    let quick = post(&client, &format!("{patient}/slow"), "slow").header("x-delay", "0");
    let quick = quick.send().await.unwrap();
    assert_eq!(quick.status(), 201);
    assert_eq!(quick.text().await.unwrap(), "run 2");
    assert_eq!(upstream.runs(), 2);
}

#[tokio::test]
async fn the_upstream_gets_the_key_and_the_scope_and_never_a_clients_scope() {
    let Some(upstream) = python() else { return };
    let route = route().with_scope(Scope::Header {
        name: HeaderName::from_static("authorization"),
        hash: true,
    });
    let (url, _stop) = serve(builder(&upstream, route)).await;
    let client = reqwest::Client::new();
    let seen = |method: Method, key: &'static str| {
        client
            .request(method, format!("{url}/headers"))
            .header("idempotency-key", key)
            .header("authorization", "Bearer secret")
            .header("idempotency-scope", "forged")
            .header("content-type", "application/json")
            .body("{}")
            .send()
    };
    let protected: serde_json::Value = seen(Method::POST, "k-1")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let headers: std::collections::HashMap<String, String> = protected
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(headers["idempotency-key"], "k-1");
    let scope = &headers["idempotency-scope"];
    assert_eq!(scope.len(), 32, "{scope}");
    assert!(!scope.contains("secret") && scope != "forged");
    // A request no route covers reaches the upstream without the scope.
    let passed: serde_json::Value = seen(Method::GET, "k-2")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let passed = passed.as_object().unwrap();
    assert!(passed
        .keys()
        .all(|k| !k.eq_ignore_ascii_case("idempotency-scope")));
}

#[tokio::test]
async fn without_a_scope_the_upstream_gets_the_callers() {
    let Some(upstream) = python() else { return };
    let client = reqwest::Client::new();
    for (route, told) in [
        (route(), true),
        (
            Route::new(Options::new(MemoryStore::new()).shared_across_callers()),
            false,
        ),
    ] {
        let (url, _stop) = serve(builder(&upstream, route)).await;
        let scope = |authorization: &'static str| {
            let request = post(&client, &format!("{url}/headers"), "k-1")
                .header("authorization", authorization)
                .header("idempotency-scope", "forged");
            async move {
                let seen: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
                seen.as_object()
                    .unwrap()
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case("idempotency-scope"))
                    .map(|(_, value)| value.as_str().unwrap().to_owned())
            }
        };
        let alice = scope("Bearer alice-secret").await;
        let bob = scope("Bearer bob-secret").await;
        if !told {
            assert_eq!((alice, bob), (None, None), "keys shared: no scope");
            continue;
        }
        let (alice, bob) = (alice.unwrap(), bob.unwrap());
        assert!(alice.starts_with("caller:") && alice.len() == 39, "{alice}");
        assert!(!alice.contains("secret"));
        assert_ne!(alice, bob, "two callers, two scopes");
    }
}

#[tokio::test]
async fn requests_no_route_covers_pass_through_untouched() {
    let Some(upstream) = python() else { return };
    let route = route()
        .with_methods([Method::POST])
        .with_paths([PathPattern::parse("/payments").unwrap()]);
    let (url, _stop) = serve(builder(&upstream, route)).await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let other = post(&client, &format!("{url}/other"), "same")
            .send()
            .await
            .unwrap();
        assert_eq!(other.status(), 201);
        assert!(other.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(upstream.runs(), 2);
    for _ in 0..2 {
        let covered = post(&client, &format!("{url}/payments"), "same")
            .send()
            .await
            .unwrap();
        assert_eq!(covered.status(), 201);
    }
    assert_eq!(upstream.runs(), 3);
}

#[tokio::test]
async fn h2c_clients_get_the_same_answers() {
    let Some(upstream) = python() else { return };
    let (url, _stop) = serve(builder(&upstream, route())).await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let first = post(&client, &format!("{url}/payments"), "h2")
        .send()
        .await
        .unwrap();
    assert_eq!(first.version(), reqwest::Version::HTTP_2);
    assert_eq!(first.status(), 201);
    let again = post(&client, &format!("{url}/payments"), "h2")
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(upstream.runs(), 1);
}

#[tokio::test]
async fn a_shutdown_finishes_the_requests_in_flight() {
    let Some(upstream) = python() else { return };
    let (url, stop) = serve(builder(&upstream, route())).await;
    let client = reqwest::Client::new();
    let in_flight = tokio::spawn(
        post(&client, &format!("{url}/slow"), "late")
            .header("x-delay", "0.5")
            .send(),
    );
    until("the upstream runs it", Duration::from_secs(10), || async {
        upstream.runs() == 1
    })
    .await;
    stop.send(()).unwrap();
    let answer = in_flight.await.unwrap().unwrap();
    assert_eq!(answer.status(), 201);
    assert_eq!(answer.text().await.unwrap(), "run 1");
    until(
        "the listener is closed",
        Duration::from_secs(10),
        || async {
            reqwest::Client::new()
                .get(format!("{url}/effects"))
                .send()
                .await
                .is_err()
        },
    )
    .await;
}

#[tokio::test]
async fn the_admin_port_serves_health_and_metrics() {
    let Some(upstream) = python() else { return };
    let metrics = idem_proxy::install_prometheus().ok();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(idem_proxy::serve_admin(
        listener,
        metrics,
        std::future::pending(),
    ));
    let (url, _stop) = serve(builder(&upstream, route())).await;
    let client = reqwest::Client::new();
    post(&client, &format!("{url}/payments"), "counted")
        .send()
        .await
        .unwrap();
    let health = client.get(format!("{admin}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let text = client
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("idem_proxy_requests_total"), "{text}");
    assert!(text.contains("idem_http_responses_total"), "{text}");
    let missing = client.get(format!("{admin}/nothing")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}
