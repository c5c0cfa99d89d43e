//! The handler-less exchange a binding drives: each way a request ends,
//! counted by how many times the "application" was told to run.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use idem_core::MemoryStore;
use idem_http::{Answer, HandoffError, Options, Run, Start, REPLAYED};

fn headers(key: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("idempotency-key", HeaderValue::from_str(key).unwrap());
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers
}

fn uri() -> Uri {
    "/payments".parse().unwrap()
}

async fn start(options: &Options, key: &str, body: &'static str) -> Start {
    let body = Bytes::from_static(body.as_bytes());
    options
        .start(&Method::POST, &uri(), &headers(key), body, None)
        .await
}

async fn read(answer: &Answer) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(frame) = answer.body.next().await {
        body.extend_from_slice(&frame.unwrap());
    }
    body
}

/// Runs the application as a binding would: head, then its frames in a
/// task of their own while the answer is awaited (a streamed body waits
/// for its reader).
async fn respond(run: Run, status: StatusCode, frames: Vec<Bytes>) -> Answer {
    let mut head = HeaderMap::new();
    head.insert("x-app", HeaderValue::from_static("1"));
    run.respond(status, head).unwrap();
    let app = run.clone();
    tokio::spawn(async move {
        for frame in frames {
            if app.send(frame).await.is_err() {
                break;
            }
        }
        app.end();
    });
    run.answer().await.unwrap()
}

fn run(start: Start) -> Run {
    match start {
        Start::Run(run) => run,
        other => panic!("expected a run, got {other:?}"),
    }
}

fn answer(start: Start) -> Answer {
    match start {
        Start::Answer(answer) => answer,
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[tokio::test]
async fn a_retry_replays_the_first_response_and_the_application_runs_once() {
    let options = Options::new(MemoryStore::new());
    let first = run(start(&options, "k1", r#"{"amount":1}"#).await);
    let frames = vec![Bytes::from_static(b"char"), Bytes::from_static(b"ged")];
    let sent = respond(first, StatusCode::CREATED, frames).await;
    assert_eq!(sent.status, StatusCode::CREATED);
    assert_eq!(sent.body.whole().as_deref(), Some(&b"charged"[..]));
    assert!(!sent.headers.contains_key(REPLAYED));

    // The same body with its keys in another order is the same request.
    let replay = answer(start(&options, "k1", r#"{ "amount": 1 }"#).await);
    assert_eq!(replay.status, StatusCode::CREATED);
    assert_eq!(replay.headers["x-app"], "1");
    assert!(replay.headers.contains_key(REPLAYED));
    assert_eq!(replay.body.whole().as_deref(), Some(&b"charged"[..]));
    assert_eq!(read(&replay).await, b"charged");
}

#[tokio::test]
async fn another_body_under_the_key_is_refused_with_422() {
    let options = Options::new(MemoryStore::new());
    let first = run(start(&options, "k2", r#"{"amount":1}"#).await);
    respond(first, StatusCode::OK, vec![Bytes::from_static(b"ok")]).await;
    let refused = answer(start(&options, "k2", r#"{"amount":2}"#).await);
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    let problem: serde_json::Value = serde_json::from_slice(&read(&refused).await).unwrap();
    assert!(
        problem["type"].as_str().unwrap().contains("mismatch"),
        "{problem}"
    );
}

#[tokio::test]
async fn a_request_finding_its_key_running_gets_409_and_then_the_replay() {
    let options = Options::new(MemoryStore::new());
    let first = run(start(&options, "k3", "{}").await);
    let busy = answer(start(&options, "k3", "{}").await);
    assert_eq!(busy.status, StatusCode::CONFLICT);
    respond(first, StatusCode::OK, vec![Bytes::from_static(b"done")]).await;
    let replay = answer(start(&options, "k3", "{}").await);
    assert_eq!(read(&replay).await, b"done");
}

#[tokio::test]
async fn an_abort_or_a_dropped_run_releases_the_key() {
    let options = Options::new(MemoryStore::new());
    let aborted = run(start(&options, "k4", "{}").await);
    aborted.abort();
    assert_eq!(aborted.answer().await.unwrap_err(), HandoffError::Aborted);
    assert_eq!(
        aborted.respond(StatusCode::OK, HeaderMap::new()),
        Err(HandoffError::Finished)
    );
    let dropped = run(start(&options, "k4", "{}").await);
    drop(dropped);
    // The release happens in the exchange's task; the next start sees it.
    let again = loop {
        match start(&options, "k4", "{}").await {
            Start::Run(run) => break run,
            Start::Answer(busy) => {
                assert_eq!(busy.status, StatusCode::CONFLICT);
                tokio::task::yield_now().await;
            }
            Start::Pass => panic!("protected"),
            _ => unreachable!(),
        }
    };
    respond(again, StatusCode::OK, vec![]).await;
}

#[tokio::test]
async fn a_server_error_reaches_the_client_unrecorded_and_the_key_runs_again() {
    let options = Options::new(MemoryStore::new());
    let failed = run(start(&options, "k5", "{}").await);
    let sent = respond(
        failed,
        StatusCode::BAD_GATEWAY,
        vec![Bytes::from_static(b"upstream")],
    )
    .await;
    assert_eq!(sent.status, StatusCode::BAD_GATEWAY);
    assert_eq!(read(&sent).await, b"upstream");
    let again = run(start(&options, "k5", "{}").await);
    respond(again, StatusCode::OK, vec![]).await;
}

#[tokio::test]
async fn a_body_failing_midway_is_a_500_and_its_key_is_not_replayable() {
    let options = Options::new(MemoryStore::new());
    let failing = run(start(&options, "k6", "{}").await);
    failing.respond(StatusCode::OK, HeaderMap::new()).unwrap();
    failing.send(Bytes::from_static(b"half")).await.unwrap();
    failing.fail("the generator raised");
    let sent = failing.answer().await.unwrap();
    assert_eq!(sent.status, StatusCode::INTERNAL_SERVER_ERROR);
    let retry = answer(start(&options, "k6", "{}").await);
    assert_eq!(retry.status, StatusCode::CONFLICT);
    let problem = String::from_utf8(read(&retry).await).unwrap();
    assert!(problem.contains("not-replayable"), "{problem}");
}

#[tokio::test]
async fn a_large_body_streams_to_its_client_and_replays_from_its_chunks() {
    let options = Options::new(MemoryStore::new()).with_max_response_body(1024);
    let frames: Vec<Bytes> = (0..300u32)
        .map(|i| Bytes::from(vec![(i % 251) as u8; 1000 + i as usize]))
        .collect();
    let expected: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();
    let first = run(start(&options, "k7", "{}").await);
    let sent = respond(first, StatusCode::OK, frames).await;
    assert_eq!(sent.body.whole(), None);
    assert_eq!(read(&sent).await, expected);
    // The recording finishes in its own task after the last frame is read.
    let replay = loop {
        let replay = answer(start(&options, "k7", "{}").await);
        if replay.status == StatusCode::OK {
            break replay;
        }
        assert_eq!(replay.status, StatusCode::CONFLICT);
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(replay.headers.contains_key(REPLAYED));
    let mut body = BytesMut::new();
    let mut frames = 0;
    while let Some(frame) = replay.body.next().await {
        body.extend_from_slice(&frame.unwrap());
        frames += 1;
    }
    assert_eq!(&body[..], &expected[..]);
    assert!(frames > 1, "a chunked replay streams");
}

#[tokio::test]
async fn unprotected_and_oversized_requests_are_decided_without_a_run() {
    let options = Options::new(MemoryStore::new()).with_max_request_body(8);
    let get = options
        .start(&Method::GET, &uri(), &headers("k8"), Bytes::new(), None)
        .await;
    assert!(matches!(get, Start::Pass));
    let mut unkeyed = headers("k8");
    unkeyed.remove("idempotency-key");
    let unkeyed = options
        .start(&Method::POST, &uri(), &unkeyed, Bytes::new(), None)
        .await;
    assert!(matches!(unkeyed, Start::Pass));
    let large = answer(start(&options, "k8", r#"{"amount":100000}"#).await);
    assert_eq!(large.status, StatusCode::PAYLOAD_TOO_LARGE);
    let mut bad = headers("k8");
    bad.insert("idempotency-key", HeaderValue::from_static(""));
    let bad = answer(
        options
            .start(&Method::POST, &uri(), &bad, Bytes::new(), None)
            .await,
    );
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn scopes_keep_callers_apart() {
    let options = Options::new(MemoryStore::new());
    let body = Bytes::from_static(b"{}");
    for tenant in ["a", "b"] {
        let started = options
            .start(
                &Method::POST,
                &uri(),
                &headers("k9"),
                body.clone(),
                Some(tenant.into()),
            )
            .await;
        let sent = respond(run(started), StatusCode::OK, vec![Bytes::from(tenant)]).await;
        assert_eq!(read(&sent).await, tenant.as_bytes());
    }
    // With no scope given, the caller's credentials scope the key.
    let mut alice = headers("k9");
    alice.insert("authorization", HeaderValue::from_static("Bearer alice"));
    let started = options
        .start(&Method::POST, &uri(), &alice, body.clone(), None)
        .await;
    respond(
        run(started),
        StatusCode::OK,
        vec![Bytes::from_static(b"alice")],
    )
    .await;
    let mut mallory = headers("k9");
    mallory.insert("authorization", HeaderValue::from_static("Bearer mallory"));
    let started = options
        .start(&Method::POST, &uri(), &mallory, body, None)
        .await;
    assert!(
        matches!(started, Start::Run(_)),
        "another caller never gets alice's response"
    );
}
