//! idem-client against a fault-injecting server on a real socket: every
//! intent succeeds within its budget with no duplicated effect, final
//! answers are not retried, and the waits are what `Retry-After` asked.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;
use idem_client::{
    Attempt, AttemptOutcome, Error, Failure, IdemClient, KeyFormat, RateLimit, RetryPolicy,
};
use serde_json::json;
use support::FaultServer;

/// A budget far above what the faults need, with short backoffs so that the
/// waits the tests look at are the ones `Retry-After` asks for.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(8)
        .with_max_elapsed(Duration::from_secs(30))
        .with_backoff(Duration::from_millis(5), Duration::from_millis(50))
        .with_attempt_timeout(Duration::from_millis(500))
}

/// A client that notes every attempt it makes.
fn observed(policy: RetryPolicy) -> (IdemClient, Arc<Mutex<Vec<Attempt>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let client = IdemClient::new()
        .with_retry(policy)
        .with_observer(move |attempt| log.lock().unwrap().push(attempt.clone()));
    (client, seen)
}

async fn pay(
    client: &IdemClient,
    server: &FaultServer,
    path: &str,
    intent: u64,
) -> idem_client::Response {
    client
        .post(server.url(path))
        .json(&json!({ "intent": intent, "amount": 1250 }))
        .send()
        .await
        .unwrap_or_else(|e| panic!("intent {intent} on {path} failed: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_intent_succeeds_once_through_every_fault() {
    let server = FaultServer::start().await;
    let (client, seen) = observed(policy());
    let faults = ["/drop", "/flaky", "/busy", "/in-progress", "/slow"];
    let intents = 4u64;
    let sends = faults.iter().enumerate().flat_map(|(f, path)| {
        let (client, server) = (&client, &server);
        (0..intents).map(move |i| async move {
            let intent = f as u64 * 100 + i;
            (intent, *path, pay(client, server, path, intent).await)
        })
    });
    for (intent, path, response) in join_all(sends).await {
        assert_eq!(
            response.status(),
            StatusCode::CREATED,
            "{path}: {}",
            response.text()
        );
        assert!(response.attempts() > 1, "{path}: the fault was never met");
        let body: serde_json::Value = response.json().unwrap();
        assert_eq!(body["intent"], intent, "{path}");
        assert_eq!(
            server.effects(intent),
            1,
            "{path}: intent {intent} made {} effects",
            server.effects(intent)
        );
    }
    // One key per intent, never a second one: each key's arrivals are all
    // of that intent's attempts.
    for path in faults {
        assert_eq!(
            server.arrivals(path).len() as u64,
            intents,
            "{path}: a key changed between retries"
        );
    }
    let seen = seen.lock().unwrap();
    assert!(
        seen.iter().any(|a| a.outcome == AttemptOutcome::Broken),
        "no dropped connection seen"
    );
    assert!(
        seen.iter().any(|a| a.outcome == AttemptOutcome::TimedOut),
        "no timeout seen"
    );
    for status in [503, 429, 409] {
        assert!(
            seen.iter().any(|a| a.outcome == AttemptOutcome::Status(StatusCode::from_u16(status).unwrap())),
            "no {status} seen"
        );
    }
}

/// Pays once through a 429 at `path`; returns the attempt that met it and
/// the time between the two arrivals, as the server saw them.
async fn through_one_429(path: &str, intent: u64) -> (Attempt, Duration) {
    let server = FaultServer::start().await;
    let (client, seen) = observed(policy());
    let response = pay(&client, &server, path, intent).await;
    assert_eq!(
        (response.status(), response.attempts()),
        (StatusCode::CREATED, 2)
    );
    assert_eq!(server.effects(intent), 1);
    let first = seen.lock().unwrap()[0].clone();
    assert_eq!(
        first.outcome,
        AttemptOutcome::Status(StatusCode::TOO_MANY_REQUESTS)
    );
    let arrivals = &server.arrivals(path)[0];
    (first, arrivals[1] - arrivals[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_is_what_retry_after_asks_in_seconds() {
    let (first, gap) = through_one_429("/busy", 1).await;
    assert_eq!(first.retry_after, Some(Duration::from_secs(1)));
    // Backoff is at most 5 ms here, so the wait is exactly what was asked.
    assert_eq!(first.retry_in, Some(Duration::from_secs(1)));
    // And the server saw it: never sooner (generous above: the machine is shared).
    assert!(
        gap >= Duration::from_secs(1) && gap < Duration::from_secs(20),
        "{gap:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_is_what_retry_after_asks_as_an_http_date() {
    let (first, gap) = through_one_429("/busy-date", 2).await;
    // The date is 3 s ahead in whole seconds, read a moment later (even a
    // very slow moment: the machine is shared).
    let asked = first.retry_after.expect("the date was read");
    assert!(
        asked > Duration::from_millis(100) && asked <= Duration::from_secs(3),
        "{asked:?}"
    );
    assert_eq!(first.retry_in, Some(asked));
    assert!(gap >= asked, "{gap:?} < {asked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_capped() {
    let server = FaultServer::start().await;
    let cap = Duration::from_millis(200);
    let (client, seen) = observed(policy().with_retry_after_cap(cap));
    let response = pay(&client, &server, "/in-progress", 3).await;
    assert_eq!(
        (response.status(), response.attempts()),
        (StatusCode::CREATED, 3)
    );
    let seen = seen.lock().unwrap();
    for attempt in &seen[..2] {
        assert_eq!(
            attempt.outcome,
            AttemptOutcome::Status(StatusCode::CONFLICT)
        );
        assert_eq!(attempt.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(attempt.retry_in, Some(cap));
    }
    assert_eq!(seen[2].retry_in, None);
    assert_eq!(server.effects(3), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_4xx_is_not_retried() {
    let server = FaultServer::start().await;
    let (client, _) = observed(policy());
    let response = pay(&client, &server, "/reject", 4).await;
    assert_eq!(
        (response.status(), response.attempts()),
        (StatusCode::BAD_REQUEST, 1)
    );
    assert_eq!(server.requests("/reject"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_body_is_its_own_error() {
    let server = FaultServer::start().await;
    let (client, _) = observed(policy());
    let send = |amount: u64| {
        client
            .post(server.url("/ok"))
            .key("order-5")
            .json(&json!({ "intent": 5, "amount": amount }))
            .send()
    };
    assert_eq!(send(100).await.unwrap().status(), StatusCode::CREATED);
    match send(101).await {
        Err(Error::KeyReused { key, response }) => {
            assert_eq!(key.as_str(), "order-5");
            assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        }
        other => panic!("expected KeyReused, got {other:?}"),
    }
    assert_eq!(server.requests("/ok"), 2, "a reused key is not retried");
    assert_eq!(server.effects(5), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_budget_ends_in_gave_up() {
    let server = FaultServer::start().await;
    let (client, _) = observed(policy().with_max_attempts(3));
    match client.post(server.url("/always-503")).send().await {
        Err(Error::GaveUp {
            attempts: 3, last, ..
        }) => {
            assert!(
                matches!(*last, Failure::Status(ref r) if r.status() == StatusCode::SERVICE_UNAVAILABLE)
            );
        }
        other => panic!("expected GaveUp after 3 attempts, got {other:?}"),
    }
    assert_eq!(server.requests("/always-503"), 3);
}

/// Sends one request to `path` under `policy`, which must give up after
/// one attempt, sent once; returns that attempt.
async fn gives_up_after_one_attempt(path: &str, policy: RetryPolicy) -> Attempt {
    let server = FaultServer::start().await;
    let (client, seen) = observed(policy);
    let result = client.post(server.url(path)).send().await;
    assert!(
        matches!(result, Err(Error::GaveUp { attempts: 1, .. })),
        "{result:?}"
    );
    assert_eq!(server.requests(path), 1);
    let attempt = seen.lock().unwrap()[0].clone();
    assert_eq!(attempt.retry_in, None);
    attempt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_time_budget_is_not_started() {
    // The server asks for an hour; the budget is 5 s: give up at once.
    let started = std::time::Instant::now();
    let policy = policy()
        .with_max_elapsed(Duration::from_secs(5))
        .with_retry_after_cap(Duration::from_secs(3600));
    gives_up_after_one_attempt("/always-429", policy).await;
    assert!(started.elapsed() < Duration::from_secs(5), "it waited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_key_are_sent_once_unless_marked_safe() {
    let server = FaultServer::start().await;
    let (client, _) = observed(policy());
    let read = client.get(server.url("/read")).send().await.unwrap();
    assert_eq!(
        (read.status(), read.attempts()),
        (StatusCode::SERVICE_UNAVAILABLE, 1)
    );
    assert!(read.key().is_none());
    let read = client
        .get(server.url("/read"))
        .retry_safe(true)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (read.status(), read.attempts()),
        (StatusCode::OK, 1),
        "the server answers 200 from now on"
    );

    let write = client
        .post(server.url("/flaky"))
        .without_key()
        .send()
        .await
        .unwrap();
    assert_eq!(
        (write.status(), write.attempts()),
        (StatusCode::SERVICE_UNAVAILABLE, 1)
    );
    assert_eq!(server.requests("/read"), 2);
    assert_eq!(server.requests("/flaky"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_marked_safe_is_retried() {
    let server = FaultServer::start().await;
    let (client, _) = observed(policy());
    let read = client
        .get(server.url("/read"))
        .retry_safe(true)
        .send()
        .await
        .unwrap();
    assert_eq!((read.status(), read.attempts()), (StatusCode::OK, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retried_then_given_up() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    drop(listener);
    let (client, seen) = observed(policy().with_max_attempts(3));
    let result = client.post(&url).send().await;
    assert!(
        matches!(result, Err(Error::GaveUp { attempts: 3, .. })),
        "{result:?}"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().all(|a| a.outcome == AttemptOutcome::Connect),
        "{seen:?}"
    );
    // The same key on every attempt.
    assert!(seen.iter().all(|a| a.key == seen[0].key && a.key.is_some()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_goes_in_the_drafts_form_or_a_custom_header() {
    let server = FaultServer::start().await;
    let client = IdemClient::new();
    let response = client
        .post(server.url("/echo-key"))
        .key("k-1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.key().unwrap().as_str(), "k-1");
    let custom = client.clone().with_key_header(
        http::HeaderName::from_static("x-request-key"),
        KeyFormat::Bare,
    );
    custom
        .post(server.url("/echo-key"))
        .key("k-2")
        .send()
        .await
        .unwrap();
    let random = client.post(server.url("/echo-key")).send().await.unwrap();
    let random_key = random.key().unwrap().as_str().to_owned();
    assert_eq!(
        server.key_headers(),
        vec![
            ("/echo-key".to_owned(), "\"k-1\"".to_owned()),
            ("/echo-key".to_owned(), "k-2".to_owned()),
            ("/echo-key".to_owned(), format!("\"{random_key}\"")),
        ]
    );
    // A bad key is refused before anything is sent.
    let bad = client
        .post(server.url("/echo-key"))
        .key("no spaces")
        .send()
        .await;
    assert!(matches!(bad, Err(Error::InvalidKey(_))), "{bad:?}");
    assert_eq!(server.requests("/echo-key"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_holds_the_host_for_every_clone() {
    let server = FaultServer::start().await;
    let (got_429, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let client = IdemClient::new()
        .with_retry(policy())
        .with_rate_limit(RateLimit::per_second(1000.0).with_burst(100))
        .with_observer(move |attempt| {
            if attempt.outcome == AttemptOutcome::Status(StatusCode::TOO_MANY_REQUESTS) {
                let _ = got_429.send(());
            }
        });
    let clone = client.clone();
    let first = tokio::spawn({
        let (client, server) = (client.clone(), server.clone());
        async move { pay(&client, &server, "/busy", 6).await }
    });
    heard.recv().await.unwrap();
    // The clone's request to the same host waits out the 429 too.
    let rejected = clone.post(server.url("/reject")).send().await.unwrap();
    assert_eq!(rejected.status(), StatusCode::BAD_REQUEST);
    assert_eq!(first.await.unwrap().status(), StatusCode::CREATED);
    let busy = server.arrivals("/busy")[0][0];
    let reject = server.arrivals("/reject")[0][0];
    assert!(
        reject - busy >= Duration::from_secs(1),
        "{:?}",
        reject - busy
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_wait_counts_against_the_time_budget() {
    let server = FaultServer::start().await;
    // One request a second, half a second of budget: the retry's token
    // comes too late, so it is never sent.
    let client = IdemClient::new()
        .with_retry(policy().with_max_elapsed(Duration::from_millis(500)))
        .with_rate_limit(RateLimit::per_second(1.0));
    let result = client.post(server.url("/always-503")).send().await;
    assert!(
        matches!(result, Err(Error::GaveUp { attempts: 1, .. })),
        "{result:?}"
    );
    assert_eq!(server.requests("/always-503"), 1);
}

// Pins that a Retry-After of u64::MAX seconds, with no cap and no budget,
// gives up instead of overflowing the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_of_any_size_is_given_up_on_not_a_panic() {
    let policy = policy()
        .with_max_elapsed(Duration::MAX)
        .with_retry_after_cap(Duration::MAX);
    let attempt = gives_up_after_one_attempt("/forever", policy).await;
    assert_eq!(attempt.retry_after, Some(Duration::from_secs(u64::MAX)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_share_one_bucket_per_host() {
    let server = FaultServer::start().await;
    let client = IdemClient::new().with_rate_limit(RateLimit::per_second(5.0));
    let clone = client.clone();
    let sends = (0..6).map(|i| {
        let client = if i % 2 == 0 { &client } else { &clone };
        client.post(server.url("/reject")).send()
    });
    for response in join_all(sends).await {
        assert_eq!(response.unwrap().status(), StatusCode::BAD_REQUEST);
    }
    // Six requests at five a second from one bucket: five gaps of 200 ms.
    // Only a lower bound, with room for the first one arriving late.
    let mut arrivals: Vec<_> = server.arrivals("/reject").concat();
    arrivals.sort();
    let span = arrivals[5] - arrivals[0];
    assert!(span >= Duration::from_millis(800), "{span:?}");
}
