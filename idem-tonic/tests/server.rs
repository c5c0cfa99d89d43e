//! The server layer in front of a real tonic server, called over loopback:
//! replays byte for byte, one run per key under racing duplicates, the
//! statuses of the layer, calls it passes through, and records apart from
//! the HTTP layer's on a shared store.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::store::Store;
use idem_core::{Idempotent, MemoryStore};
use idem_testing::{StoreKind, TestStore};
use idem_tonic::{Code, IdempotencyLayer};
use idem_tonic_testing::{ChargeRequest, PaymentsClient, CHARGE, WATCH};
use support::{charge, raw, serve};
use tower::ServiceExt;

/// Polls `done` until it holds, for at most 10 s.
async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the condition never held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_byte_identical_on_every_store() {
    for kind in StoreKind::ALL {
        let Some(fresh) = kind.fresh().await else {
            continue;
        };
        let server = serve(IdempotencyLayer::new(fresh.store).unary(CHARGE)).await;
        let channel = server.channel();

        // A charge: the message, the headers and the trailers come back.
        let key = [("idempotency-key", "replay-ok")];
        let first = raw(&channel, CHARGE, &key, &charge(1250, "")).await;
        let again = raw(&channel, CHARGE, &key, &charge(1250, "")).await;
        assert_eq!(first.code(), Code::Ok, "{kind}");
        assert!(!first.replayed() && again.replayed(), "{kind}");
        assert!(!first.body.is_empty(), "{kind}");
        assert_eq!(again.body, first.body, "{kind}: the message");
        assert_eq!(again.trailers, first.trailers, "{kind}: the trailers");
        assert_eq!(again.recorded_headers(), first.recorded_headers(), "{kind}");
        assert_eq!(first.headers.get("x-charged-by").unwrap(), "payments");

        // An error a retry would get again: recorded with its trailers.
        let key = [("idempotency-key", "replay-invalid")];
        let first = raw(&channel, CHARGE, &key, &charge(-1, "invalid_argument")).await;
        let again = raw(&channel, CHARGE, &key, &charge(-1, "invalid_argument")).await;
        assert_eq!(first.code(), Code::InvalidArgument, "{kind}");
        assert!(again.replayed(), "{kind}");
        assert_eq!(again.recorded_headers(), first.recorded_headers(), "{kind}");
        assert_eq!((again.body, again.trailers), (first.body, first.trailers));
        assert_eq!(first.headers.get("x-reason").unwrap(), "amount");

        // UNAVAILABLE releases the key: the retry runs the handler again.
        let key = [("idempotency-key", "replay-unavailable")];
        for _ in 0..2 {
            let answer = raw(&channel, CHARGE, &key, &charge(5, "unavailable")).await;
            assert_eq!(answer.code(), Code::Unavailable, "{kind}");
            assert!(!answer.replayed(), "{kind}");
        }
        assert_eq!(server.payments.charges(), 1, "{kind}");
        assert_eq!(server.payments.calls(), 4, "{kind}");
    }
}

/// How many keys the race uses; `IDEM_GRPC_RACE_KEYS` raises it.
fn race_keys() -> usize {
    std::env::var("IDEM_GRPC_RACE_KEYS")
        .ok()
        .and_then(|keys| keys.parse().ok())
        .unwrap_or(200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_duplicates_run_each_key_once() {
    const DUPLICATES: usize = 20;
    let keys = race_keys();
    for kind in [StoreKind::Memory, StoreKind::Sqlite, StoreKind::Redis] {
        let Some(fresh) = kind.fresh().await else {
            continue;
        };
        let server = serve(IdempotencyLayer::new(fresh.store).unary(CHARGE)).await;
        let channel = server.channel();
        // A key's duplicates are sent together, and at most 160 calls at
        // once: more than HTTP/2's usual 100 concurrent streams would only
        // queue in the channel.
        let calls_at_once = Arc::new(tokio::sync::Semaphore::new(160));
        let mut calls = tokio::task::JoinSet::new();
        for key in 0..keys {
            for _ in 0..DUPLICATES {
                let mut client = PaymentsClient::new(channel.clone());
                let calls_at_once = Arc::clone(&calls_at_once);
                calls.spawn(async move {
                    let _permit = calls_at_once.acquire_owned().await.unwrap();
                    let mut request = tonic::Request::new(charge(key as i64 + 1, ""));
                    let value = format!("race-{key}").parse().unwrap();
                    request.metadata_mut().insert("idempotency-key", value);
                    (key, client.charge(request).await)
                });
            }
        }
        let mut charged: HashMap<usize, String> = HashMap::new();
        let (mut in_flight, mut store_failed) = (0, 0);
        while let Some(joined) = calls.join_next().await {
            let (key, answer) = joined.unwrap();
            match answer {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    assert_eq!(reply.amount, key as i64 + 1, "{kind}");
                    let first = charged.entry(key).or_insert(reply.charge_id.clone());
                    assert_eq!(*first, reply.charge_id, "{kind}: one charge per key");
                }
                Err(status) if status.code() == Code::Aborted => {
                    assert!(status.metadata().get("grpc-retry-pushback-ms").is_some());
                    in_flight += 1;
                }
                // A store call that outlasts its deadline on a loaded
                // machine (the Redis client's is half a second) is
                // answered UNAVAILABLE: the call did not run, and the
                // claim it may have left blocks the key until its lease
                // lapses, so no duplicate runs it either.
                Err(status) => {
                    assert_eq!(status.code(), Code::Unavailable, "{kind}: {status:?}");
                    assert!(status.message().contains("did not run"), "{status:?}");
                    store_failed += 1;
                }
            }
        }
        // Every run answered its own caller OK, so each key that ran is in
        // `charged`, with the one charge every OK answer for it carries:
        // a second run would be a second charge id or one charge too many.
        let ran = charged.len() as u64;
        assert_eq!(server.payments.charges(), ran, "{kind}: double runs");
        assert_eq!(server.payments.calls(), ran, "{kind}");
        assert!(ran > 0, "{kind}: no key ran");
        eprintln!(
            "{kind}: {keys} keys x {DUPLICATES}: {ran} ran, {in_flight} ABORTED, \
             {store_failed} UNAVAILABLE"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_flight_is_aborted_with_pushback_and_another_request_refused() {
    let lease = Duration::from_secs(30);
    let idem = Idempotent::new(MemoryStore::new())
        .with_namespace("grpc")
        .with_lease(lease);
    let server = serve(IdempotencyLayer::from_idempotent(idem).unary(CHARGE)).await;
    let channel = server.channel();
    let key = [("idempotency-key", "in-flight")];
    let slow = {
        let channel = channel.clone();
        tokio::spawn(async move { raw(&channel, CHARGE, &key, &charge(7, "slow")).await })
    };
    let payments = server.payments.clone();
    until(|| payments.slow_entered() == 1).await;

    let busy = raw(&channel, CHARGE, &key, &charge(7, "slow")).await;
    assert_eq!(busy.code(), Code::Aborted);
    let pushback = idem_tonic::pushback(&busy.headers).expect("a pushback");
    assert!(
        pushback > Duration::ZERO && pushback <= lease,
        "{pushback:?}"
    );

    // Another message, or another method, under the key: refused, even in
    // flight (the fingerprint is checked before the state).
    let other = raw(&channel, CHARGE, &key, &charge(8, "slow")).await;
    assert_eq!(other.code(), Code::FailedPrecondition);
    let waiting = {
        let channel = channel.clone();
        let metadata = [("idempotency-key", "in-flight"), ("prefer", "wait=10")];
        tokio::spawn(async move { raw(&channel, CHARGE, &metadata, &charge(7, "slow")).await })
    };
    payments.release_slow(1);
    let first = slow.await.unwrap();
    let waited = waiting.await.unwrap();
    assert_eq!(first.code(), Code::Ok);
    assert_eq!(waited.code(), Code::Ok);
    assert_eq!(waited.body, first.body);
    assert_eq!(payments.charges(), 1);
    assert_eq!(payments.calls(), 1);
}

/// A call's metadata.
type Metadata<'a> = &'a [(&'a str, &'a str)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_and_messages_get_their_statuses() {
    let server = serve(
        IdempotencyLayer::new(MemoryStore::new())
            .unary(CHARGE)
            .require_key(true)
            .with_max_request_message(64),
    )
    .await;
    let channel = server.channel();
    let long = "k".repeat(256);
    let cases: [(Metadata, ChargeRequest, Code); 4] = [
        (&[], charge(1, ""), Code::InvalidArgument),
        (
            &[("idempotency-key", "")],
            charge(1, ""),
            Code::InvalidArgument,
        ),
        (
            &[("idempotency-key", &long)],
            charge(1, ""),
            Code::InvalidArgument,
        ),
        (
            &[("idempotency-key", "big")],
            ChargeRequest {
                currency: "x".repeat(100),
                ..charge(1, "")
            },
            Code::ResourceExhausted,
        ),
    ];
    for (metadata, message, code) in cases {
        let answer = raw(&channel, CHARGE, metadata, &message).await;
        assert_eq!(answer.code(), code, "{metadata:?}");
    }
    assert_eq!(server.payments.calls(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_and_keyless_calls_pass_through() {
    let server = serve(IdempotencyLayer::new(MemoryStore::new()).unary(CHARGE)).await;
    let mut client = PaymentsClient::new(server.channel());
    for _ in 0..2 {
        let mut request = tonic::Request::new(charge(3, ""));
        request
            .metadata_mut()
            .insert("idempotency-key", "stream".parse().unwrap());
        let mut stream = client.watch(request).await.unwrap().into_inner();
        let mut runs = Vec::new();
        while let Some(reply) = stream.message().await.unwrap() {
            runs.push(reply.run);
        }
        assert_eq!(runs, [1, 2, 3]);
    }
    for _ in 0..2 {
        client.charge(charge(3, "")).await.unwrap();
    }
    assert_eq!(
        server.payments.charges(),
        2,
        "keyless charges run each time"
    );
    assert_eq!(server.payments.calls(), 4);
    let _ = WATCH;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_can_come_from_the_request_message() {
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .unary_keyed_by(CHARGE, |request: &ChargeRequest| {
            Some(request.request_id.clone())
        });
    let server = serve(layer).await;
    let mut client = PaymentsClient::new(server.channel());
    let with_id = ChargeRequest {
        request_id: "8b7c2a4e-aip-155".into(),
        ..charge(9, "")
    };
    let first = client.charge(with_id.clone()).await.unwrap();
    let again = client.charge(with_id).await.unwrap();
    assert!(again.metadata().get("idempotent-replayed").is_some());
    assert_eq!(first.into_inner(), again.into_inner());
    // Without a request id the call is not protected.
    client.charge(charge(9, "")).await.unwrap();
    client.charge(charge(9, "")).await.unwrap();
    assert_eq!(server.payments.charges(), 3);
}

/// An axum route behind idem-tower that counts its runs.
fn http_app(store: Arc<dyn Store>, runs: Arc<std::sync::atomic::AtomicU64>) -> axum::Router {
    let handler = move || {
        let runs = Arc::clone(&runs);
        async move {
            let run = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            (StatusCode::CREATED, format!("http charge {run}"))
        }
    };
    axum::Router::new()
        .route("/payments", axum::routing::post(handler))
        .layer(idem_tower::IdempotencyLayer::new(store))
}

async fn http_post(app: &axum::Router, key: &str) -> (StatusCode, Bytes) {
    let request = Request::post("/payments")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(axum::body::Body::new(Full::new(Bytes::from_static(b"{}"))))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_grpc_records_share_a_store_without_colliding() {
    for kind in [StoreKind::Memory, StoreKind::Sqlite, StoreKind::Redis] {
        let Some(fresh) = kind.fresh().await else {
            continue;
        };
        let http_runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let app = http_app(Arc::clone(&fresh.store), Arc::clone(&http_runs));
        let server = serve(IdempotencyLayer::new(Arc::clone(&fresh.store)).unary(CHARGE)).await;
        let channel = server.channel();
        let key = [("idempotency-key", "shared-key")];
        for _ in 0..2 {
            let (status, body) = http_post(&app, "shared-key").await;
            assert_eq!(
                (status, &body[..]),
                (StatusCode::CREATED, &b"http charge 1"[..])
            );
            let answer = raw(&channel, CHARGE, &key, &charge(4, "")).await;
            assert_eq!(answer.code(), Code::Ok, "{kind}");
        }
        assert_eq!(http_runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(server.payments.charges(), 1, "{kind}");

        // The control: a gRPC layer in HTTP's namespace meets its records.
        let same = Idempotent::from_arc(Arc::clone(&fresh.store));
        let clash = serve(IdempotencyLayer::from_idempotent(same).unary(CHARGE)).await;
        let answer = raw(&clash.channel(), CHARGE, &key, &charge(4, "")).await;
        assert_eq!(answer.code(), Code::FailedPrecondition, "{kind}");
        assert_eq!(clash.payments.calls(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_scoped_by_the_callers_authorization_metadata() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let server = serve(IdempotencyLayer::new(Arc::clone(&store)).unary(CHARGE)).await;
    let channel = server.channel();
    let call = |key: &'static str, authorization: Option<&'static str>| {
        let channel = channel.clone();
        async move {
            let mut metadata = vec![("idempotency-key", key)];
            metadata.extend(authorization.map(|value| ("authorization", value)));
            let answer = raw(&channel, CHARGE, &metadata, &charge(1250, "")).await;
            (answer.code(), answer.replayed())
        }
    };
    let (alice, bob) = (Some("Bearer alice"), Some("Bearer bob"));
    assert_eq!(call("order-1", alice).await, (Code::Ok, false));
    assert_eq!(call("order-1", alice).await, (Code::Ok, true));
    assert_eq!(
        server.payments.charges(),
        1,
        "the same caller's retry replays"
    );
    assert_eq!(call("order-1", bob).await, (Code::Ok, false));
    assert_eq!(server.payments.charges(), 2, "another caller runs anew");
    assert_eq!(call("order-1", None).await, (Code::Ok, false));
    assert_eq!(call("order-1", None).await, (Code::Ok, true));
    assert_eq!(
        server.payments.charges(),
        3,
        "anonymous calls have a scope of their own"
    );
    assert_eq!(call("order-2", None).await, (Code::Ok, false));
    assert_eq!(call("order-2", alice).await, (Code::Ok, false));
    assert_eq!(
        server.payments.charges(),
        5,
        "a caller never replays an anonymous call"
    );

    // The opt-out shares keys, and so reaches the records made before
    // callers were told apart; scoped by caller, those are refused.
    let shared = serve(
        IdempotencyLayer::new(Arc::clone(&store))
            .unary(CHARGE)
            .shared_across_callers(),
    )
    .await;
    let channel = shared.channel();
    let mut metadata = vec![
        ("idempotency-key", "order-3"),
        ("authorization", "Bearer alice"),
    ];
    let first = raw(&channel, CHARGE, &metadata, &charge(1250, "")).await;
    metadata[1].1 = "Bearer bob";
    let again = raw(&channel, CHARGE, &metadata, &charge(1250, "")).await;
    assert!(!first.replayed() && again.replayed());
    assert_eq!(shared.payments.charges(), 1);
    for caller in [alice, bob, None] {
        let (code, replayed) = call("order-3", caller).await;
        assert_eq!(code, Code::AlreadyExists, "{caller:?}");
        assert!(!replayed);
    }
    assert_eq!(
        server.payments.charges(),
        5,
        "an unscoped record's retry never runs"
    );
}
