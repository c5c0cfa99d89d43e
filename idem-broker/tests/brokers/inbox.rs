//! Signed webhooks into idem-inbox's receiver, published to each broker by
//! an `Enqueuer`, handled by the consumer: every event handled once, every
//! resend published nothing (counted on the broker), every forgery refused
//! with nothing published.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, StatusCode};
use idem_broker::enqueue::{message_id, Enqueuer};
use idem_broker::{Consumer, Outcome};
use idem_inbox::verify::StandardWebhooks;
use idem_inbox::{Received, Receiver};

use crate::support::{Fixture, Kind};
use crate::{kinds, quick};

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const EVENTS: usize = 12;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The headers a Standard Webhooks provider sends with `body` for `id`,
/// signed with `secret`.
fn signed(secret: &str, id: &str, body: &[u8]) -> HeaderMap {
    let ts = now();
    let signature = StandardWebhooks::new([secret]).unwrap().sign(id, ts, body);
    let mut headers = HeaderMap::new();
    headers.insert("webhook-id", HeaderValue::from_str(id).unwrap());
    headers.insert("webhook-timestamp", HeaderValue::from(ts));
    headers.insert(
        "webhook-signature",
        HeaderValue::from_str(&signature).unwrap(),
    );
    headers
}

fn body(n: usize) -> Vec<u8> {
    format!("{{\"type\":\"invoice.paid\",\"n\":{n}}}").into_bytes()
}

async fn receiver(fixture: &Fixture) -> Receiver {
    let enqueuer = Enqueuer::new(
        fixture.publisher().await,
        fixture.idem(Duration::from_secs(5)).await,
    );
    Receiver::new(
        "acme",
        StandardWebhooks::new([SECRET]).unwrap(),
        Arc::new(enqueuer),
    )
}

/// Every event delivered three times (twice at once, once later) is
/// published once and handled once; forged and tampered deliveries are
/// refused and publish nothing.
async fn webhooks_are_published_once_and_handled_once(kind: Kind) {
    let Some(fixture) = Fixture::new(kind, Duration::from_secs(2)).await else {
        return;
    };
    let receiver = receiver(&fixture).await;
    for n in 0..EVENTS {
        let (id, body) = (format!("evt_{n}"), body(n));
        let headers = signed(SECRET, &id, &body);
        // A provider's retry racing its first delivery, then a late resend.
        let (first, second) = tokio::join!(
            receiver.receive(&headers, &body),
            receiver.receive(&headers, &body)
        );
        let late = receiver.receive(&headers, &body).await;
        let mut answers = [first.unwrap(), second.unwrap(), late.unwrap()];
        answers.sort_by_key(|a| !matches!(a, Received::Enqueued(_)));
        let job = message_id("acme", &id);
        assert_eq!(
            answers[0],
            Received::Enqueued(idem_inbox::queue::JobId::new(&job)),
            "{kind:?}: {answers:?}"
        );
        assert!(
            answers[1..]
                .iter()
                .all(|a| matches!(a, Received::Duplicate(j) if j.as_str() == job)),
            "{kind:?}: {answers:?}"
        );
    }
    let forgeries = [
        // Signed with another secret.
        (
            signed("whsec_bm90IHRoZSBzZWNyZXQ=", "evt_forged", &body(99)),
            body(99),
        ),
        // A genuine signature over another body.
        (signed(SECRET, "evt_0", &body(0)), body(1)),
    ];
    for (headers, body) in &forgeries {
        let refused = receiver.receive(headers, body).await.unwrap_err();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{kind:?}");
    }
    assert_eq!(fixture.published().await, EVENTS as u64, "{kind:?}");

    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    fixture
        .drain(
            &consumer,
            fixture.effect_handler(),
            Duration::from_secs(30),
            |e| e.len() == EVENTS,
        )
        .await;
    let effects = fixture.effects().await;
    assert_eq!(effects.len(), EVENTS, "{kind:?}: {effects:?}");
    for n in 0..EVENTS {
        let key = message_id("acme", &format!("evt_{n}"));
        assert_eq!(effects.get(&key), Some(&1), "{kind:?}: {effects:?}");
    }
    assert_eq!(
        consumer.stats().of(Outcome::Handled),
        EVENTS as u64,
        "{kind:?}"
    );
    assert!(fixture.dead_letters().await.is_empty(), "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_published_once_and_handled_once_on_every_broker() {
    for kind in kinds() {
        webhooks_are_published_once_and_handled_once(kind).await;
    }
}

/// The receiver crashed after publishing and before recording it: the
/// resend publishes the event again, and the consumer, keyed by the same
/// message id, still handles it once.
async fn a_publish_whose_record_was_lost_is_handled_once(kind: Kind) {
    let Some(fixture) = Fixture::new(kind, Duration::from_secs(2)).await else {
        return;
    };
    let (id, body) = ("evt_lost", body(7));
    let job = message_id("acme", id);
    // What the crashed receiver published.
    idem_broker::enqueue::Publish::publish(&fixture.publisher().await, &job, &body)
        .await
        .unwrap();
    // Past JetStream's 100 ms duplicate window in these fixtures.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let received = receiver(&fixture)
        .await
        .receive(&signed(SECRET, id, &body), &body)
        .await
        .unwrap();
    assert_eq!(
        received,
        Received::Enqueued(idem_inbox::queue::JobId::new(&job)),
        "{kind:?}"
    );
    assert_eq!(fixture.published().await, 2, "{kind:?}");

    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    fixture
        .drain(
            &consumer,
            fixture.effect_handler(),
            Duration::from_secs(30),
            |e| e.len() == 1,
        )
        .await;
    assert_eq!(fixture.effects().await.get(&job), Some(&1), "{kind:?}");
    assert_eq!(consumer.stats().of(Outcome::Handled), 1, "{kind:?}");
    assert_eq!(consumer.stats().of(Outcome::Replayed), 1, "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_whose_record_was_lost_is_handled_once_on_every_broker() {
    for kind in kinds() {
        a_publish_whose_record_was_lost_is_handled_once(kind).await;
    }
}
