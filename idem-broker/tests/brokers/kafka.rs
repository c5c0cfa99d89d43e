//! Kafka: the fixture's topics, group and reads, and the cases only Kafka
//! has — a duplicate from a new producer session, and a rebalance while
//! handlers run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_broker::kafka::{KafkaPublisher, KafkaSource, KeyFrom, KEY_HEADER, REASON_HEADER};
use idem_broker::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem_broker::rdkafka::client::DefaultClientContext;
use idem_broker::rdkafka::consumer::{BaseConsumer, Consumer as _};
use idem_broker::rdkafka::message::{BorrowedMessage, Headers, Message as _};
use idem_broker::rdkafka::producer::FutureRecord;
use idem_broker::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use idem_broker::{Consumer, Message, Outcome, Source};
use idem_testing::Server;

use crate::quick;
use crate::support::{Fixture, Kind};

/// Partitions of every test topic: two, so a second consumer of the group
/// takes one in a rebalance.
pub(crate) const PARTITIONS: i32 = 2;
const TIMEOUT: Duration = Duration::from_secs(10);

/// The client config every fixture client starts from.
pub(crate) fn config() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", Server::Kafka.url());
    config
}

/// The group every consumer of the fixture `name` joins, with a session
/// short enough that a killed member's partitions move on in seconds.
pub(crate) fn group_config(name: &str) -> ClientConfig {
    let mut config = config();
    config
        .set("group.id", format!("{name}-group"))
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("max.poll.interval.ms", "30000");
    config
}

/// Creates the topic `name` and its dead-letter topic.
pub(crate) async fn create_topics(name: &str) {
    let admin: AdminClient<DefaultClientContext> = config().create().unwrap();
    let dead = format!("{name}.dead");
    let topics = [
        NewTopic::new(name, PARTITIONS, TopicReplication::Fixed(1)),
        NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
    ];
    for result in admin
        .create_topics(
            &topics,
            &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }
}

/// Deletes the fixture's topics (best effort, at the end of a test).
pub(crate) async fn delete_topics(
    name: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let admin: AdminClient<DefaultClientContext> = config().create()?;
    let dead = format!("{name}.dead");
    admin
        .delete_topics(&[name, &dead], &AdminOptions::new())
        .await?;
    Ok(())
}

pub(crate) fn publisher(name: &str) -> KafkaPublisher {
    KafkaPublisher::new(config(), name).unwrap()
}

/// A source of the fixture's group.
pub(crate) fn source(name: &str) -> KafkaSource {
    KafkaSource::builder(group_config(name), name)
        .with_prefetch(8)
        .with_revoke_grace(Duration::from_secs(5))
        .start()
        .unwrap()
}

/// A consumer of no group's subscription, for reading offsets.
fn reader(group: Option<&str>) -> BaseConsumer {
    let mut config = config();
    config
        .set("group.id", group.unwrap_or("idem-test-reader"))
        .set("enable.auto.commit", "false");
    config.create().unwrap()
}

/// (low, end) of each partition of `topic`. Tansu's high watermark
/// (ListOffsets, latest) can stop short of the last records of a batch of
/// several, so the end is read: from the reported high watermark's last
/// record on, until nothing more comes.
fn watermarks(consumer: &BaseConsumer, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
    (0..partitions)
        .map(|p| {
            let (low, high) = consumer.fetch_watermarks(topic, p, TIMEOUT).unwrap();
            (
                low,
                read_to_end(topic, p, (high - 1).max(low), high, |_| {}),
            )
        })
        .collect()
}

/// Reads `topic`'s `partition` from `from` up to at least `known_end`
/// (the high watermark the broker reported), then on until 300 ms pass
/// with nothing new, giving each message to `each`; returns the offset
/// after the last (at least `known_end`).
fn read_to_end(
    topic: &str,
    partition: i32,
    from: i64,
    known_end: i64,
    mut each: impl FnMut(&BorrowedMessage<'_>),
) -> i64 {
    if known_end <= from {
        return known_end.max(from);
    }
    let consumer = reader(None);
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, partition, Offset::Offset(from))
        .unwrap();
    consumer.assign(&list).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let mut end = from;
    let mut quiet = Instant::now();
    // Silence proves the end only once the reported end is reached: the
    // first fetch of a fresh consumer can take longer than the quiet time.
    while end < known_end || quiet.elapsed() < Duration::from_millis(300) {
        assert!(
            Instant::now() < deadline,
            "{topic}/{partition}: read to {end}, not to {known_end}"
        );
        if let Some(message) = consumer.poll(Duration::from_millis(50)) {
            let message = message.unwrap();
            end = end.max(message.offset() + 1);
            each(&message);
            quiet = Instant::now();
        }
    }
    end
}

/// Messages ever published to the fixture's topic.
pub(crate) fn published(name: &str) -> u64 {
    let consumer = reader(None);
    watermarks(&consumer, name, PARTITIONS)
        .iter()
        .map(|(low, high)| (high - low) as u64)
        .sum()
}

/// Messages after the group's committed offsets.
pub(crate) fn unsettled(name: &str) -> u64 {
    let group = format!("{name}-group");
    let consumer = reader(Some(&group));
    let mut list = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        list.add_partition(name, p);
    }
    let committed = consumer.committed_offsets(list, TIMEOUT).unwrap();
    watermarks(&consumer, name, PARTITIONS)
        .iter()
        .enumerate()
        .map(|(p, (low, high))| {
            let at = committed
                .find_partition(name, p as i32)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .unwrap_or(*low);
            (high - at).max(0) as u64
        })
        .sum()
}

/// The dead letters: (key header, reason header).
pub(crate) fn dead_letters(name: &str) -> Vec<(String, String)> {
    let dead = format!("{name}.dead");
    let (low, high) = reader(None).fetch_watermarks(&dead, 0, TIMEOUT).unwrap();
    let mut out = Vec::new();
    read_to_end(&dead, 0, low, high, |message| {
        let header = |key: &str| {
            message
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == key))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        out.push((header(KEY_HEADER), header(REASON_HEADER)));
    });
    out
}

/// A duplicate published by a new producer session (a restarted
/// service, or a caller's retry after a lost acknowledgement) gets a new
/// offset — Kafka's idempotent producer stops retries within one session
/// only — and the consumer still makes its effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_from_a_new_producer_session_makes_one_effect() {
    let Some(fixture) = Fixture::new(Kind::Kafka, Duration::from_secs(2)).await else {
        return;
    };
    for _session in 0..2 {
        // Each publisher is its own producer session (a new producer id).
        let publisher = publisher(&fixture.name);
        for n in 0..5 {
            publisher
                .send(&format!("evt-{n}"), b"{\"amount\":3}")
                .await
                .unwrap();
        }
    }
    assert_eq!(
        fixture.published().await,
        10,
        "Kafka kept both sessions' publishes"
    );
    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    fixture
        .drain(
            &consumer,
            fixture.effect_handler(),
            Duration::from_secs(30),
            |e| e.len() == 5,
        )
        .await;
    let effects = fixture.effects().await;
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    assert_eq!(consumer.stats().of(Outcome::Handled), 5);
    assert_eq!(consumer.stats().of(Outcome::Replayed), 5);
}

/// A second consumer joins the group while the first is in the middle of
/// its handlers: the first's partitions are revoked, its running handlers
/// finish and their offsets are committed before the partitions move, so
/// the new owner neither loses a message nor reads a settled one again
/// (no replays, nothing abandoned) and every handler ran once. Messages
/// keep coming until the second consumer has handled some, so the
/// rebalance lands mid-stream however long the group takes to form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_mid_handler_loses_nothing_and_runs_nothing_twice() {
    let Some(fixture) = Fixture::new(Kind::Kafka, Duration::from_secs(2)).await else {
        return;
    };
    let fixture = Arc::new(fixture);
    let calls = Arc::new(AtomicU64::new(0));
    let effects = fixture.effect_handler();
    let handler = {
        let calls = calls.clone();
        move |message: Message| {
            let (calls, effects) = (calls.clone(), effects.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                idem_broker::Handler::handle(&effects, &message).await
            }
        }
    };
    let idem = fixture.idem(Duration::from_secs(10)).await;
    let first = Consumer::new(idem.clone()).with_config(quick());
    let second = Consumer::new(idem).with_config(quick());
    // Publishes a message every 50 ms (faster than one consumer's four
    // 300 ms handlers take them) until the second consumer has handled
    // some and at least 24 are out, or 40 s pass; returns how many.
    let publishing = {
        let (fixture, second) = (fixture.clone(), second.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(40);
            let mut n = 0;
            while (n < 24 || second.stats().of(Outcome::Handled) == 0) && Instant::now() < deadline
            {
                fixture.publish(&format!("ship-{n}"), b"{}").await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            n
        })
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let run = |consumer: &Consumer, source: Box<dyn Source>| {
        let (consumer, handler, stop) = (consumer.clone(), handler.clone(), stop.clone());
        tokio::spawn(async move {
            consumer
                .run(source, handler, async move { stop.notified().await })
                .await
        })
    };
    let a = run(&first, Box::new(source(&fixture.name)));
    // The second joins while the first has handlers running.
    let deadline = Instant::now() + Duration::from_secs(30);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the first consumer never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let b = run(&second, Box::new(source(&fixture.name)));
    let published = publishing.await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let effects = fixture.effects().await;
        if effects.len() == published && fixture.unsettled().await == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not drained: {} of {published} effects, unsettled {}",
            effects.len(),
            fixture.unsettled().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.notify_waiters();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    let effects = fixture.effects().await;
    assert!(effects.values().all(|n| *n == 1), "{effects:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        published as u64,
        "a handler ran twice"
    );
    let handled = first.stats().of(Outcome::Handled) + second.stats().of(Outcome::Handled);
    assert_eq!(handled, published as u64);
    assert!(
        first.stats().of(Outcome::Handled) > 0 && second.stats().of(Outcome::Handled) > 0,
        "the partitions never moved: {:?} {:?}",
        first.stats(),
        second.stats()
    );
    for consumer in [&first, &second] {
        assert_eq!(
            consumer.stats().of(Outcome::Replayed),
            0,
            "a settled message was read again"
        );
        assert_eq!(
            consumer.stats().of(Outcome::Abandoned),
            0,
            "a handler was cut off"
        );
    }
}

/// Publishes `payload` to the fixture's topic with a message key and no
/// idem header, as a producer that knows nothing of idem does.
async fn publish_plain(name: &str, key: Option<&str>, payload: &[u8]) {
    let publisher = publisher(name);
    let mut record = FutureRecord::<str, [u8]>::to(name).payload(payload);
    if let Some(key) = key {
        record = record.key(key);
    }
    publisher
        .producer()
        .send(record, TIMEOUT)
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// The key comes from where the source is told: a message without the
/// idem header is dead-lettered unrun by the default source, and a source
/// keyed by a payload field handles such messages once per field value —
/// two publishes with the same field, one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_come_from_the_header_the_message_key_or_a_payload_field() {
    let Some(fixture) = Fixture::new(Kind::Kafka, Duration::from_secs(2)).await else {
        return;
    };
    publish_plain(&fixture.name, Some("k-1"), br#"{"event":{"id":"e-1"}}"#).await;
    publish_plain(&fixture.name, None, br#"{"event":{"id":"e-1"}}"#).await;
    publish_plain(&fixture.name, None, br#"{"event":{"id":7}}"#).await;
    // The default source reads the idem-key header: none here.
    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    fixture
        .drain(
            &consumer,
            fixture.effect_handler(),
            Duration::from_secs(30),
            |_| true,
        )
        .await;
    let dead = fixture.dead_letters().await;
    assert_eq!(dead.len(), 3, "{dead:?}");
    assert!(
        dead.iter().all(|(_, reason)| reason.contains("no id")),
        "{dead:?}"
    );
    assert!(fixture.effects().await.is_empty());

    // Another group on the same topic, keyed by the payload's event id.
    let config = group_config(&format!("{}-by-field", fixture.name));
    let source = KafkaSource::builder(config, &fixture.name)
        .with_key(KeyFrom::payload_field("/event/id"))
        .start()
        .unwrap();
    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    let stop = Arc::new(tokio::sync::Notify::new());
    let run = {
        let (consumer, handler, stop) = (consumer.clone(), fixture.effect_handler(), stop.clone());
        tokio::spawn(async move {
            consumer
                .run(source, handler, async move { stop.notified().await })
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumer.stats().of(Outcome::Handled) + consumer.stats().of(Outcome::Replayed) < 3 {
        assert!(Instant::now() < deadline, "{:?}", consumer.stats());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.notify_one();
    run.await.unwrap().unwrap();
    let effects = fixture.effects().await;
    assert_eq!(effects.get("e-1"), Some(&1), "{effects:?}");
    assert_eq!(effects.get("7"), Some(&1), "{effects:?}");
    assert_eq!(consumer.stats().of(Outcome::Replayed), 1);
}
