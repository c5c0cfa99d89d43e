//! Redeliveries forced on the real brokers: an ack withheld, a connection
//! closed, an ack wait or claim idle time run out while a consumer stalls,
//! and a graceful shutdown in the middle of a handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem_broker::{BrokerError, Consumer, Delivery, Message, Outcome, Source};

use crate::support::{Fixture, Kind};
use crate::{kinds, quick};

/// A real delivery whose ack is never sent: the consumer believes it
/// acked, the broker never hears of it.
#[derive(Debug)]
struct WithheldAck(Box<dyn Delivery>);

#[async_trait]
impl Delivery for WithheldAck {
    fn message_id(&self) -> Option<&str> {
        self.0.message_id()
    }
    fn payload(&self) -> &[u8] {
        self.0.payload()
    }
    fn delivery_count(&self) -> u32 {
        self.0.delivery_count()
    }
    fn locator(&self) -> String {
        self.0.locator()
    }
    async fn ack(&self) -> Result<(), BrokerError> {
        Ok(())
    }
    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        self.0.retry(delay).await
    }
    async fn dead_letter(&self, reason: &str) -> Result<(), BrokerError> {
        self.0.dead_letter(reason).await
    }
    async fn in_progress(&self) -> Result<(), BrokerError> {
        self.0.in_progress().await
    }
}

/// The next delivery from `source`, waiting at most ten seconds.
async fn next_delivery(source: &mut Box<dyn Source>) -> Box<dyn Delivery> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(delivery) = source.next(Duration::from_millis(200)).await.unwrap() {
            return delivery;
        }
        assert!(Instant::now() < deadline, "no delivery within 10 s");
    }
}

/// The handler ran and its outcome is recorded, but the ack never reached
/// the broker (withheld; on RabbitMQ the connection then closes): the
/// broker redelivers after its ack wait, claim idle time or channel
/// close, and the redelivery is acked on the recorded outcome without a
/// second run.
async fn a_withheld_ack_is_redelivered_and_replayed(kind: Kind) {
    let Some(fixture) = Fixture::new(kind, Duration::from_millis(600)).await else {
        return;
    };
    fixture.publish("invoice-1", b"{}").await;
    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    let handler = fixture.effect_handler();
    {
        let mut source = fixture.source("first").await;
        let delivery = next_delivery(&mut source).await;
        let outcome = consumer
            .handle(
                Box::new(WithheldAck(delivery)),
                &handler,
                source.heartbeat(),
            )
            .await;
        assert_eq!(outcome, Outcome::Handled, "{kind:?}");
        // Dropping the source closes RabbitMQ's connection: it takes the
        // unacked delivery back.
    }
    fixture
        .drain(&consumer, handler, Duration::from_secs(20), |e| {
            e.len() == 1
        })
        .await;
    assert_eq!(
        fixture.effects().await.get("invoice-1"),
        Some(&1),
        "{kind:?}"
    );
    assert_eq!(consumer.stats().of(Outcome::Replayed), 1, "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withheld_ack_is_redelivered_and_replayed_on_every_broker() {
    for kind in kinds() {
        a_withheld_ack_is_redelivered_and_replayed(kind).await;
    }
}

/// Consumer A stalls (its thread blocked: no idem renewals, no in-progress
/// acks) past the ack wait and the idem lease; B gets the redelivery,
/// takes the key over and is still running when A wakes. A must settle
/// nothing: a late ack would settle B's delivery of the same message
/// before B's outcome is recorded (JetStream accepts it; a Streams XACK
/// does not look at the owner). While B runs, the message is still
/// unsettled; afterwards B's one effect stands.
async fn a_late_ack_from_a_stalled_consumer_settles_nothing(kind: Kind) {
    let Some(fixture) = Fixture::new(kind, Duration::from_secs(1)).await else {
        return;
    };
    fixture.publish("refund-9", b"{}").await;
    // The idem lease is shorter than the ack wait (1 s), so when B gets
    // the redelivery A's lease has lapsed and B takes the key over.
    let lease = Duration::from_millis(400);
    let consumer_a = Consumer::new(fixture.idem(lease).await).with_config(quick());
    let consumer_b = Consumer::new(fixture.idem(lease).await).with_config(quick());

    let mut source_a = fixture.source("a").await;
    let delivery_a = next_delivery(&mut source_a).await;
    let a_done = Arc::new(AtomicBool::new(false));
    let stalled = |_: Message| async {
        std::thread::sleep(Duration::from_secs(3));
        Ok(())
    };
    // A runs on a thread and runtime of its own, so its stall freezes only
    // A: its handler, its heartbeats and its idem renewals.
    let a = {
        let (a_done, heartbeat) = (a_done.clone(), source_a.heartbeat());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let outcome = runtime.block_on(consumer_a.handle(delivery_a, &stalled, heartbeat));
            a_done.store(true, Ordering::SeqCst);
            outcome
        })
    };

    let mut source_b = fixture.source("b").await;
    let delivery_b = next_delivery(&mut source_b).await;
    assert!(delivery_b.delivery_count() >= 2, "{kind:?}: {delivery_b:?}");
    let fixture = Arc::new(fixture);
    let unsettled_while_b_ran = Arc::new(std::sync::Mutex::new(None));
    let handler_b = {
        let (fixture, a_done, seen) = (
            fixture.clone(),
            a_done.clone(),
            unsettled_while_b_ran.clone(),
        );
        move |message: Message| {
            let (fixture, a_done, seen) = (fixture.clone(), a_done.clone(), seen.clone());
            async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !a_done.load(Ordering::SeqCst) && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                *seen.lock().unwrap() = Some(fixture.unsettled().await);
                fixture.add_effect(&message.key).await;
                Ok(())
            }
        }
    };
    let outcome_b = consumer_b
        .handle(delivery_b, &handler_b, source_b.heartbeat())
        .await;
    assert_eq!(a.join().unwrap(), Outcome::Abandoned, "{kind:?}");
    assert_eq!(outcome_b, Outcome::Handled, "{kind:?}");
    assert_eq!(*unsettled_while_b_ran.lock().unwrap(), Some(1), "{kind:?}");
    assert_eq!(fixture.unsettled().await, 0, "{kind:?}");
    assert_eq!(
        fixture.effects().await.get("refund-9"),
        Some(&1),
        "{kind:?}"
    );
}

// RabbitMQ gives a delivery to another consumer only once the first
// one's channel is closed, and a closed channel cannot ack: the withheld
// ack test covers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_ack_from_a_stalled_consumer_settles_nothing_on_jetstream_and_streams() {
    for kind in kinds() {
        if !matches!(kind, Kind::Nats | Kind::Streams) {
            continue;
        }
        a_late_ack_from_a_stalled_consumer_settles_nothing(kind).await;
    }
}

/// Shutdown in the middle of a handler lets it finish, records and acks
/// it, then returns: nothing is left for a redelivery.
async fn shutdown_lets_running_handlers_finish(kind: Kind) {
    let Some(fixture) = Fixture::new(kind, Duration::from_secs(2)).await else {
        return;
    };
    fixture.publish("ship-4", b"{}").await;
    let consumer = Consumer::new(fixture.idem(Duration::from_secs(5)).await).with_config(quick());
    let started = Arc::new(tokio::sync::Notify::new());
    let effects = fixture.effect_handler();
    let handler = {
        let started = started.clone();
        move |message: Message| {
            let (started, effects) = (started.clone(), effects.clone());
            async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_millis(500)).await;
                idem_broker::Handler::handle(&effects, &message).await
            }
        }
    };
    let source = fixture.source("only").await;
    let began = Instant::now();
    consumer
        .run(source, handler, async move { started.notified().await })
        .await
        .unwrap();
    assert!(began.elapsed() >= Duration::from_millis(500), "{kind:?}");
    assert_eq!(fixture.effects().await.get("ship-4"), Some(&1), "{kind:?}");
    assert_eq!(consumer.stats().of(Outcome::Handled), 1, "{kind:?}");
    assert_eq!(fixture.unsettled().await, 0, "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_handlers_finish_on_every_broker() {
    for kind in kinds() {
        shutdown_lets_running_handlers_finish(kind).await;
    }
}
