//! The receiver over real sockets, under axum and under actix-web alike:
//! verified deliveries are enqueued once, forgeries are 401 and enqueue
//! nothing, duplicates are 2xx and enqueue nothing twice. Every case runs
//! once per framework (the `axum` and `actix` modules at the end).

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_inbox::queue::{JobState, Queue};
use idem_inbox::verify::{SecretHeader, StandardWebhooks, Stripe};
use idem_inbox::Receiver;
use reqwest::StatusCode;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The framework the receiver is served with.
#[derive(Debug, Clone, Copy)]
enum Web {
    Axum,
    Actix,
}

/// Serves `receiver` with `web` on a free port; returns its URL.
async fn serve(web: Web, receiver: Receiver) -> String {
    match web {
        Web::Axum => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, receiver.router()).await.unwrap() });
            format!("http://{addr}/")
        }
        Web::Actix => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = actix_web::HttpServer::new(move || {
                actix_web::App::new().service(receiver.clone().actix_resource("/"))
            })
            .workers(1)
            .disable_signals()
            .listen(listener)
            .unwrap()
            .run();
            tokio::spawn(server);
            format!("http://{addr}/")
        }
    }
}

fn signed(
    client: &reqwest::Client,
    url: &str,
    id: &str,
    ts: i64,
    body: &'static str,
) -> reqwest::RequestBuilder {
    let signature = StandardWebhooks::new([SECRET])
        .unwrap()
        .sign(id, ts, body.as_bytes());
    client
        .post(url)
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(body)
}

async fn pending(queue: &dyn Queue) -> Vec<idem_inbox::queue::Job> {
    queue.claim(1000, Duration::from_secs(60)).await.unwrap()
}

async fn a_verified_delivery_is_enqueued_once_and_its_resends_are_2xx_duplicates(web: Web) {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let url = serve(
        web,
        Receiver::new(
            "acme",
            StandardWebhooks::new([SECRET]).unwrap(),
            Arc::clone(&queue),
        ),
    )
    .await;
    let client = reqwest::Client::new();
    let body = r#"{"type":"invoice.paid","amount":1250}"#;
    let ts = now();
    let mut answers = Vec::new();
    for _ in 0..3 {
        let response = signed(&client, &url, "msg_1", ts, body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        let json: serde_json::Value = response.json().await.unwrap();
        answers.push(json["status"].as_str().unwrap().to_owned());
    }
    assert_eq!(answers, ["enqueued", "duplicate", "duplicate"]);
    let jobs = pending(&*queue).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].source, "acme");
    assert_eq!(jobs[0].event_id, "msg_1");
    assert_eq!(
        jobs[0].payload,
        body.as_bytes(),
        "the raw body was not kept"
    );
}

async fn forged_stale_and_unsigned_deliveries_are_401_problems_and_enqueue_nothing(web: Web) {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let url = serve(
        web,
        Receiver::new(
            "acme",
            StandardWebhooks::new([SECRET]).unwrap(),
            Arc::clone(&queue),
        ),
    )
    .await;
    let client = reqwest::Client::new();
    let ts = now();
    let requests = [
        // Signed for another body.
        signed(&client, &url, "m1", ts, "{}").body(r#"{"amount":999999}"#),
        // Stale and future.
        signed(&client, &url, "m2", ts - 3600, "{}"),
        signed(&client, &url, "m3", ts + 3600, "{}"),
        // Signed by someone else.
        client
            .post(&url)
            .header("webhook-id", "m4")
            .header("webhook-timestamp", ts.to_string())
            .header(
                "webhook-signature",
                StandardWebhooks::new(["whsec_b3RoZXI="])
                    .unwrap()
                    .sign("m4", ts, b"{}"),
            )
            .body("{}"),
        // No signature at all.
        client.post(&url).header("webhook-id", "m5").body("{}"),
    ];
    for request in requests {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: serde_json::Value = response.json().await.unwrap();
        assert_eq!(problem["status"], 401);
        assert!(problem["type"]
            .as_str()
            .unwrap()
            .ends_with("webhook-unverified"));
    }
    assert!(
        pending(&*queue).await.is_empty(),
        "a rejected delivery was enqueued"
    );
}

async fn telegram_updates_are_keyed_by_their_update_id(web: Web) {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let receiver = Receiver::new(
        "telegram",
        SecretHeader::telegram(["tg-secret"]).unwrap(),
        Arc::clone(&queue),
    )
    .with_event_id_at("/update_id");
    let url = serve(web, receiver).await;
    let client = reqwest::Client::new();
    let send = |token: &'static str, body: &'static str| {
        client
            .post(&url)
            .header("x-telegram-bot-api-secret-token", token)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for body in [
        r#"{"update_id":1001,"message":{"text":"hi"}}"#,
        r#"{"update_id":1001,"message":{"text":"hi"}}"#,
        r#"{"update_id":1002,"message":{"text":"again"}}"#,
    ] {
        assert_eq!(
            send("tg-secret", body).await.unwrap().status(),
            StatusCode::ACCEPTED
        );
    }
    assert_eq!(
        send("guess", r#"{"update_id":1003}"#)
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );
    for no_id in [r#"{"message":{}}"#, r#"{"update_id":1.5}"#, "not json"] {
        let response = send("tg-secret", no_id).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{no_id}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
    let mut ids: Vec<_> = pending(&*queue)
        .await
        .into_iter()
        .map(|j| j.event_id)
        .collect();
    ids.sort();
    assert_eq!(ids, ["1001", "1002"]);
}

async fn stripe_events_are_keyed_by_the_payload_id(web: Web) {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let stripe = Stripe::new(["whsec_stripe"]).unwrap();
    let url = serve(
        web,
        Receiver::new("stripe", stripe.clone(), Arc::clone(&queue)).with_event_id_at("/id"),
    )
    .await;
    let body = r#"{"id":"evt_1N","type":"charge.succeeded"}"#;
    let response = reqwest::Client::new()
        .post(&url)
        .header("stripe-signature", stripe.sign(now(), body.as_bytes()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert_eq!(pending(&*queue).await[0].event_id, "evt_1N");
}

async fn an_oversized_body_is_413_and_enqueues_nothing(web: Web) {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let url = serve(
        web,
        Receiver::new(
            "acme",
            StandardWebhooks::new([SECRET]).unwrap(),
            Arc::clone(&queue),
        )
        .with_max_body(16),
    )
    .await;
    let response = signed(
        &reqwest::Client::new(),
        &url,
        "big",
        now(),
        r#"{"padding":"xxxxxxxxxxxx"}"#,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        problem,
        idem_http::Problem::WebhookTooLarge(16).document(),
        "the 413 is not the catalogue's"
    );
    assert!(pending(&*queue).await.is_empty());
}

/// Concurrent resends of one event: every sender gets a 2xx, one job.
async fn racing_resends_enqueue_one_job(web: Web, queue: Arc<dyn Queue>) {
    let url = serve(
        web,
        Receiver::new(
            "acme",
            StandardWebhooks::new([SECRET]).unwrap(),
            Arc::clone(&queue),
        ),
    )
    .await;
    let client = reqwest::Client::new();
    let ts = now();
    let mut sends = Vec::new();
    for _ in 0..16 {
        sends.push(tokio::spawn(
            signed(&client, &url, "msg_race", ts, "{}").send(),
        ));
    }
    let mut enqueued = 0;
    for send in sends {
        let response = send.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        let json: serde_json::Value = response.json().await.unwrap();
        enqueued += usize::from(json["status"] == "enqueued");
    }
    assert_eq!(enqueued, 1, "racing resends enqueued {enqueued} jobs");
    let jobs = pending(&*queue).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        queue.inspect(&jobs[0].id).await.unwrap().unwrap().state,
        JobState::Running
    );
}

async fn racing_resends_enqueue_one_job_on_sqlite(web: Web) {
    let (queue, _dir) = support::sqlite_queue().await;
    racing_resends_enqueue_one_job(web, Arc::new(queue)).await;
}

async fn racing_resends_enqueue_one_job_on_postgres(web: Web) {
    let Some(pool) = support::postgres_pool(8).await else {
        return;
    };
    let (queue, _guard) = support::postgres_queue(pool).await;
    racing_resends_enqueue_one_job(web, Arc::new(queue)).await;
}

/// Runs every case under one framework.
macro_rules! cases {
    ($web:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case($web).await;
            }
        )*
    };
}

mod under_axum {
    use super::Web;
    cases!(Web::Axum; a_verified_delivery_is_enqueued_once_and_its_resends_are_2xx_duplicates, forged_stale_and_unsigned_deliveries_are_401_problems_and_enqueue_nothing, telegram_updates_are_keyed_by_their_update_id, stripe_events_are_keyed_by_the_payload_id, an_oversized_body_is_413_and_enqueues_nothing, racing_resends_enqueue_one_job_on_sqlite, racing_resends_enqueue_one_job_on_postgres);
}

mod under_actix {
    use super::Web;
    cases!(Web::Actix; a_verified_delivery_is_enqueued_once_and_its_resends_are_2xx_duplicates, forged_stale_and_unsigned_deliveries_are_401_problems_and_enqueue_nothing, telegram_updates_are_keyed_by_their_update_id, stripe_events_are_keyed_by_the_payload_id, an_oversized_body_is_413_and_enqueues_nothing, racing_resends_enqueue_one_job_on_sqlite, racing_resends_enqueue_one_job_on_postgres);
}
