//! idem-broker against real brokers: NATS JetStream, RabbitMQ, Redis
//! Streams and (feature `kafka`) a Kafka-protocol broker. Every test runs once per broker, on fresh names; nothing here
//! mocks a broker.

mod child;
mod delivery;
mod inbox;
#[cfg(feature = "kafka")]
mod kafka;
mod support;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use idem_broker::{Consumer, ConsumerConfig, HandlerError, Message, Outcome};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::{Fixture, Kind};

/// Every counter increment recorded so far, as (name, labels, increment).
/// A snapshot drains the recorder, so each is kept here and every reader
/// (tests run in parallel) filters by its own labels.
/// One counter increment: name, labels, amount.
type Increment = (String, Vec<(String, String)>, u64);

fn counters() -> Vec<Increment> {
    static RECORDER: OnceLock<(Snapshotter, Mutex<Vec<Increment>>)> = OnceLock::new();
    let (snapshotter, kept) = RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        (snapshotter, Mutex::new(Vec::new()))
    });
    let mut kept = kept.lock().unwrap();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            kept.push((key.key().name().to_owned(), labels, n));
        }
    }
    kept.clone()
}

/// `idem_broker_deliveries_total` with this namespace and outcome.
fn delivered(namespace: &str, outcome: Outcome) -> u64 {
    counters()
        .into_iter()
        .filter(|(name, labels, _)| {
            name == "idem_broker_deliveries_total"
                && labels.contains(&("namespace".to_owned(), namespace.to_owned()))
                && labels.contains(&("outcome".to_owned(), outcome.name().to_owned()))
        })
        .map(|(.., n)| n)
        .sum()
}

#[cfg(not(feature = "kafka"))]
const KINDS: [Kind; 3] = [Kind::Nats, Kind::Amqp, Kind::Streams];
#[cfg(feature = "kafka")]
const KINDS: [Kind; 4] = [Kind::Nats, Kind::Amqp, Kind::Streams, Kind::Kafka];

/// The brokers the shared cases run on: every one, or those named in
/// `IDEM_BROKERS` (`nats,amqp,streams,kafka`), to repeat one broker's runs.
fn kinds() -> Vec<Kind> {
    match std::env::var("IDEM_BROKERS") {
        Ok(names) => KINDS
            .into_iter()
            .filter(|kind| names.split(',').any(|name| name.trim() == kind.name()))
            .collect(),
        Err(_) => KINDS.to_vec(),
    }
}

fn quick() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_concurrency(4)
        .with_poll(Duration::from_millis(100))
        .with_backoff(idem_core::backoff::Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(200),
        ))
        .with_max_deliveries(4)
        .with_grace(Duration::from_secs(5))
}

/// The same message id published twice (a producer retry after the
/// broker's dedupe window) runs its handler once: the second is replayed.
async fn duplicate_publishes_run_once(kind: Kind) {
    let Some(fixture) = Fixture::new(kind, Duration::from_secs(2)).await else {
        return;
    };
    for round in 0..2 {
        for n in 0..10 {
            fixture
                .publish(&format!("order-{n}"), b"{\"amount\":1}")
                .await;
        }
        if round == 0 {
            // Past JetStream's 100 ms duplicate window in these fixtures.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    fixture
        .drain(
            &consumer,
            fixture.effect_handler(),
            Duration::from_secs(30),
            |e| e.len() == 10,
        )
        .await;
    let effects = fixture.effects().await;
    assert_eq!(effects.len(), 10, "{kind:?}: {effects:?}");
    assert!(effects.values().all(|n| *n == 1), "{kind:?}: {effects:?}");
    assert_eq!(consumer.stats().of(Outcome::Handled), 10, "{kind:?}");
    assert_eq!(consumer.stats().of(Outcome::Replayed), 10, "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_publishes_run_once_on_every_broker() {
    for kind in kinds() {
        duplicate_publishes_run_once(kind).await;
    }
}

/// A poison message (a permanent error) goes to the dead letters with its
/// reason at once; one that keeps failing goes there after the allowed
/// deliveries; the others are handled once each.
async fn poison_messages_are_dead_lettered(kind: Kind) {
    // A redelivery window far above any pause of a loaded test machine:
    // the deliveries counted here must all be the consumer's own hand-backs,
    // not a broker's redelivery of a message whose ack came late.
    let Some(fixture) = Fixture::new(kind, Duration::from_secs(10)).await else {
        return;
    };
    fixture.publish("good-1", b"ok").await;
    fixture.publish("poison", b"malformed").await;
    fixture.publish("flaky", b"always fails").await;
    fixture.publish("good-2", b"ok").await;
    let effects = fixture.effect_handler();
    let handler = move |message: Message| {
        let effects = effects.clone();
        async move {
            match message.payload.as_slice() {
                b"malformed" => Err(HandlerError::permanent("cannot parse the body")),
                b"always fails" => Err(HandlerError::retryable(format!(
                    "upstream down on delivery {}",
                    message.delivery
                ))),
                _ => idem_broker::Handler::handle(&effects, &message).await,
            }
        }
    };
    counters();
    let namespace = format!("poison-{kind:?}-{}", std::process::id());
    let idem = fixture
        .idem(Duration::from_secs(5))
        .await
        .with_namespace(namespace.as_str());
    let consumer = Consumer::new(idem).with_config(quick());
    fixture
        .drain(&consumer, handler, Duration::from_secs(30), |e| {
            e.len() == 2
        })
        .await;
    let mut dead = fixture.dead_letters().await;
    dead.sort();
    assert_eq!(dead.len(), 2, "{kind:?}: {dead:?}");
    assert_eq!(dead[0].0, "flaky", "{kind:?}");
    assert!(dead[0].1.contains("delivery 4"), "{kind:?}: {dead:?}");
    assert_eq!(dead[1].0, "poison", "{kind:?}");
    assert_eq!(dead[1].1, "cannot parse the body", "{kind:?}");
    let effects = fixture.effects().await;
    assert_eq!(effects.get("good-1"), Some(&1), "{kind:?}: {effects:?}");
    assert_eq!(effects.get("good-2"), Some(&1), "{kind:?}: {effects:?}");
    assert_eq!(consumer.stats().of(Outcome::DeadLettered), 2, "{kind:?}");
    // The flaky one was handed back three times before the fourth failed.
    assert_eq!(consumer.stats().of(Outcome::Retried), 3, "{kind:?}");
    // The metrics facade counted the dead letters and hand-backs under this
    // consumer's namespace.
    assert_eq!(delivered(&namespace, Outcome::Retried), 3, "{kind:?}");
    assert_eq!(delivered(&namespace, Outcome::DeadLettered), 2, "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_are_dead_lettered_on_every_broker() {
    for kind in kinds() {
        poison_messages_are_dead_lettered(kind).await;
    }
}

/// A handler that fails twice and then succeeds makes its effect once,
/// on its third delivery.
async fn a_failed_message_is_retried_until_it_succeeds(kind: Kind) {
    let Some(fixture) = Fixture::new(kind, Duration::from_secs(2)).await else {
        return;
    };
    fixture.publish("charge-1", b"{}").await;
    let effects = fixture.effect_handler();
    let handler = move |message: Message| {
        let effects = effects.clone();
        async move {
            if message.delivery < 3 {
                return Err(HandlerError::retryable("gateway timeout"));
            }
            idem_broker::Handler::handle(&effects, &message).await
        }
    };
    counters();
    let namespace = format!("retried-{kind:?}-{}", std::process::id());
    let idem = fixture
        .idem(Duration::from_secs(5))
        .await
        .with_namespace(namespace.as_str());
    let consumer = Consumer::new(idem).with_config(quick());
    fixture
        .drain(&consumer, handler, Duration::from_secs(30), |e| {
            e.len() == 1
        })
        .await;
    assert_eq!(
        fixture.effects().await.get("charge-1"),
        Some(&1),
        "{kind:?}"
    );
    assert_eq!(consumer.stats().of(Outcome::Retried), 2, "{kind:?}");
    assert_eq!(consumer.stats().of(Outcome::Handled), 1, "{kind:?}");
    assert!(fixture.dead_letters().await.is_empty(), "{kind:?}");
    // The metrics facade counted the same, under this consumer's namespace
    // (each test has a namespace of its own: they share the recorder).
    assert_eq!(delivered(&namespace, Outcome::Retried), 2, "{kind:?}");
    assert_eq!(delivered(&namespace, Outcome::Handled), 1, "{kind:?}");
    assert_eq!(delivered(&namespace, Outcome::DeadLettered), 0, "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_message_is_retried_until_it_succeeds_on_every_broker() {
    for kind in kinds() {
        a_failed_message_is_retried_until_it_succeeds(kind).await;
    }
}

/// A second publish of a message whose first is still being handled meets
/// a live lease on every delivery and is handed back each time; past the
/// delivery limit it is still handed back, not parked, and once the first
/// is recorded it is replayed and acked.
async fn a_duplicate_waiting_out_a_long_handler_is_not_dead_lettered(kind: Kind) {
    // Pins the consumer's read of the key past the delivery limit: without
    // it the duplicate, delivered more than twice while the first ran,
    // went to the dead letters.
    let Some(fixture) = Fixture::new(kind, Duration::from_secs(2)).await else {
        return;
    };
    fixture.publish("slow", b"{}").await;
    // Past JetStream's 100 ms duplicate window in these fixtures.
    tokio::time::sleep(Duration::from_millis(200)).await;
    fixture.publish("slow", b"{}").await;
    let effects = fixture.effect_handler();
    let handler = move |message: Message| {
        let effects = effects.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            idem_broker::Handler::handle(&effects, &message).await
        }
    };
    // A short lease: the duplicate is handed back for at most 600 ms at a
    // time, so it is delivered more than twice while the first runs.
    let idem = fixture.idem(Duration::from_millis(600)).await;
    let consumer = Consumer::new(idem).with_config(quick().with_max_deliveries(2));
    // One consumer for the whole of the first handler's run (the drain
    // below restarts RabbitMQ's consumer every 600 ms).
    let source = fixture.source("long").await;
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let run = {
        let (consumer, handler, stop) = (consumer.clone(), handler.clone(), stop.clone());
        tokio::spawn(async move {
            consumer
                .run(source, handler, async move { stop.notified().await })
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.notify_one();
    run.await.unwrap().unwrap();
    fixture
        .drain(&consumer, handler, Duration::from_secs(30), |e| {
            e.len() == 1
        })
        .await;
    assert_eq!(fixture.effects().await.get("slow"), Some(&1), "{kind:?}");
    assert!(
        fixture.dead_letters().await.is_empty(),
        "{kind:?}: {:?}",
        fixture.dead_letters().await
    );
    assert_eq!(consumer.stats().of(Outcome::Handled), 1, "{kind:?}");
    assert_eq!(consumer.stats().of(Outcome::Replayed), 1, "{kind:?}");
    // Handed back on its first 2 deliveries and past the limit at least once.
    let retried = consumer.stats().of(Outcome::Retried);
    assert!(retried >= 3, "{kind:?}: retried {retried}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_out_a_long_handler_is_not_dead_lettered_on_every_broker() {
    for kind in kinds() {
        a_duplicate_waiting_out_a_long_handler_is_not_dead_lettered(kind).await;
    }
}

/// A message without an id cannot be made idempotent: it is parked, not
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_an_id_is_dead_lettered_unrun() {
    let Some(fixture) = Fixture::new(Kind::Streams, Duration::from_secs(2)).await else {
        return;
    };
    let mut redis = fixture.redis.clone();
    redis::cmd("XADD")
        .arg(format!("{}:stream", fixture.name))
        .arg("*")
        .arg("payload")
        .arg("no id")
        .query_async::<String>(&mut redis)
        .await
        .unwrap();
    fixture.publish("with-id", b"x").await;
    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    fixture
        .drain(
            &consumer,
            fixture.effect_handler(),
            Duration::from_secs(20),
            |e| e.len() == 1,
        )
        .await;
    let dead = fixture.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].1.contains("no id"), "{dead:?}");
    assert_eq!(fixture.effects().await.len(), 1);
}

use idem_broker::redis;
