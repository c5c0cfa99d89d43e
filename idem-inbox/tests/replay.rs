//! Replays: what a captured delivery, sent again, can make of the inbox.
//! GitHub signs the body only, so a resend under a new delivery id must
//! still be a duplicate; the other schemes dedupe as their docs say.

mod support;

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use idem_inbox::queue::{Enqueued, NewJob, Queue};
use idem_inbox::verify::{GitHub, SecretHeader, StandardWebhooks, Stripe, Verifier};
use idem_inbox::{Received, Receiver};

const SECRET: &str = "It's a Secret to Everybody";

fn github_headers(verifier: &GitHub, delivery: &str, body: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-hub-signature-256",
        HeaderValue::from_str(&verifier.sign(body)).unwrap(),
    );
    headers.insert(
        "x-github-delivery",
        HeaderValue::from_str(delivery).unwrap(),
    );
    headers
}

fn github(queue: Arc<dyn Queue>) -> (Receiver, GitHub) {
    let verifier = GitHub::new([SECRET]).unwrap();
    (Receiver::new("github", verifier.clone(), queue), verifier)
}

const PUSH: &[u8] =
    br#"{"ref":"refs/heads/main","after":"0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"}"#;
const STAR: &[u8] = br#"{"action":"created","starred_at":"2026-12-01T10:00:00Z"}"#;

// Regression: the delivery id is not signed, so a captured delivery resent
// under a new one verified, enqueued as a new event and was handled again.
async fn a_github_delivery_resent_under_a_new_id_is_a_duplicate(queue: Arc<dyn Queue>) {
    let (receiver, gh) = github(queue.clone());
    let first = receiver
        .receive(&github_headers(&gh, "72d3162e-0001", PUSH), PUSH)
        .await
        .unwrap();
    let Received::Enqueued(job) = first else {
        panic!("the first delivery is new: {first:?}")
    };
    for delivery in ["72d3162e-0002", "attacker-chosen", "sha256:anything"] {
        let resent = receiver
            .receive(&github_headers(&gh, delivery, PUSH), PUSH)
            .await
            .unwrap();
        assert_eq!(resent, Received::Duplicate(job.clone()), "under {delivery}");
    }
    assert_eq!(claim_all(&*queue).await, ["72d3162e-0001"]);
}

/// GitHub's own redelivery keeps the id and the body: a duplicate.
async fn a_github_redelivery_with_the_same_id_is_a_duplicate(queue: Arc<dyn Queue>) {
    let (receiver, gh) = github(queue.clone());
    let headers = github_headers(&gh, "72d3162e-0001", PUSH);
    let first = receiver.receive(&headers, PUSH).await.unwrap();
    let again = receiver.receive(&headers, PUSH).await.unwrap();
    assert!(matches!(first, Received::Enqueued(_)), "{first:?}");
    assert_eq!(again, Received::Duplicate(first_id(&first)));
    assert_eq!(claim_all(&*queue).await, ["72d3162e-0001"]);
}

/// Two events, two bodies, two ids: both are handled.
async fn two_github_bodies_under_two_ids_are_both_enqueued(queue: Arc<dyn Queue>) {
    let (receiver, gh) = github(queue.clone());
    for (delivery, body) in [("push-1", PUSH), ("star-1", STAR)] {
        let got = receiver
            .receive(&github_headers(&gh, delivery, body), body)
            .await
            .unwrap();
        assert!(matches!(got, Received::Enqueued(_)), "{delivery}: {got:?}");
    }
    assert_eq!(claim_all(&*queue).await, ["push-1", "star-1"]);
}

// Regression: rows an earlier build wrote carry no body key; they must
// keep deduping by their event id, and then by the body too.
async fn a_job_an_earlier_build_queued_by_id_still_dedupes(queue: Arc<dyn Queue>) {
    // What an earlier build's receiver enqueued: the event id, no keys.
    let old = queue
        .enqueue(NewJob::new("github", "72d3162e-0001", PUSH))
        .await
        .unwrap();
    let Enqueued::New(old) = old else {
        panic!("a fresh queue holds nothing: {old:?}")
    };
    let (receiver, gh) = github(queue.clone());
    let redelivered = receiver
        .receive(&github_headers(&gh, "72d3162e-0001", PUSH), PUSH)
        .await
        .unwrap();
    assert_eq!(redelivered, Received::Duplicate(old.clone()));
    // The redelivery gave the old job its body key.
    let resent = receiver
        .receive(&github_headers(&gh, "72d3162e-0002", PUSH), PUSH)
        .await
        .unwrap();
    assert_eq!(resent, Received::Duplicate(old));
    assert_eq!(claim_all(&*queue).await, ["72d3162e-0001"]);
}

/// The shared-secret scheme dedupes on the id in the body: a verbatim
/// resend is a duplicate, two updates are two jobs, and a changed body
/// with a new id — which anyone holding the captured secret can send — is
/// a new event, as the scheme's docs say.
async fn secret_header_deliveries_dedupe_on_the_id_in_their_body(queue: Arc<dyn Queue>) {
    let receiver = Receiver::new(
        "telegram",
        SecretHeader::telegram(["s3cret"]).unwrap(),
        queue.clone(),
    )
    .with_event_id_at("/update_id");
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-telegram-bot-api-secret-token",
        HeaderValue::from_static("s3cret"),
    );
    let one = br#"{"update_id":1,"message":{"text":"hi"}}"#;
    let two = br#"{"update_id":2,"message":{"text":"ho"}}"#;
    let forged = br#"{"update_id":3,"message":{"text":"hi"}}"#;
    let first = receiver.receive(&headers, one).await.unwrap();
    assert!(matches!(first, Received::Enqueued(_)), "{first:?}");
    let resent = receiver.receive(&headers, one).await.unwrap();
    assert_eq!(resent, Received::Duplicate(first_id(&first)));
    for body in [&two[..], &forged[..]] {
        let got = receiver.receive(&headers, body).await.unwrap();
        assert!(matches!(got, Received::Enqueued(_)), "{got:?}");
    }
    assert_eq!(claim_all(&*queue).await, ["1", "2", "3"]);
}

/// Resends of one captured delivery under many ids, all at once, leave
/// one job: the body key is checked and written atomically.
async fn racing_github_resends_under_new_ids_enqueue_one_job(queue: Arc<dyn Queue>) {
    let (receiver, gh) = github(queue.clone());
    let sends = (0..16).map(|n| {
        let (receiver, headers) = (
            receiver.clone(),
            github_headers(&gh, &format!("d-{n}"), PUSH),
        );
        tokio::spawn(async move { receiver.receive(&headers, PUSH).await.unwrap() })
    });
    let mut new = 0;
    for send in futures_util::future::join_all(sends).await {
        if matches!(send.unwrap(), Received::Enqueued(_)) {
            new += 1;
        }
    }
    assert_eq!(new, 1);
    assert_eq!(claim_all(&*queue).await.len(), 1);
}

fn first_id(received: &Received) -> idem_inbox::queue::JobId {
    match received {
        Received::Enqueued(id) | Received::Duplicate(id) => id.clone(),
        other => panic!("{other:?}"),
    }
}

/// The event ids of every job due, sorted.
async fn claim_all(queue: &dyn Queue) -> Vec<String> {
    let jobs = queue
        .claim(100, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let mut ids: Vec<String> = jobs.into_iter().map(|j| j.event_id).collect();
    ids.sort();
    ids
}

/// Only GitHub's verification leaves a resend under a new id open.
#[test]
fn only_a_body_only_signature_is_replayable() {
    let gh = GitHub::new([SECRET]).unwrap();
    let verified = gh.verify(&github_headers(&gh, "d", PUSH), PUSH).unwrap();
    assert!(verified.replayable);

    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let standard = StandardWebhooks::new(["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"]).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("webhook-id", HeaderValue::from_static("msg_1"));
    headers.insert(
        "webhook-timestamp",
        HeaderValue::from_str(&now.to_string()).unwrap(),
    );
    headers.insert(
        "webhook-signature",
        HeaderValue::from_str(&standard.sign("msg_1", now, PUSH)).unwrap(),
    );
    assert!(!standard.verify(&headers, PUSH).unwrap().replayable);

    let stripe = Stripe::new(["whsec_stripe"]).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(
        "stripe-signature",
        HeaderValue::from_str(&stripe.sign(now, PUSH)).unwrap(),
    );
    assert!(!stripe.verify(&headers, PUSH).unwrap().replayable);

    let secret = SecretHeader::telegram(["s3cret"]).unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-telegram-bot-api-secret-token",
        HeaderValue::from_static("s3cret"),
    );
    assert!(!secret.verify(&headers, PUSH).unwrap().replayable);
}

macro_rules! on_both_queues {
    ($($case:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    let (queue, _dir) = crate::support::sqlite_queue().await;
                    super::$case(std::sync::Arc::new(queue)).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(pool) = crate::support::postgres_pool(20).await else { return };
                    let (queue, _guard) = crate::support::postgres_queue(pool).await;
                    super::$case(std::sync::Arc::new(queue)).await;
                }
            )*
        }
    };
}

on_both_queues!(
    a_github_delivery_resent_under_a_new_id_is_a_duplicate,
    a_github_redelivery_with_the_same_id_is_a_duplicate,
    two_github_bodies_under_two_ids_are_both_enqueued,
    a_job_an_earlier_build_queued_by_id_still_dedupes,
    secret_header_deliveries_dedupe_on_the_id_in_their_body,
    racing_github_resends_under_new_ids_enqueue_one_job,
);
