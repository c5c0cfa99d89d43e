//! The seam between a broker's client and the consumer loop: a [`Source`]
//! of [`Delivery`]s, each of which can be acked, retried, dead-lettered or
//! kept alive.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::BrokerError;

/// One delivery of one message, as a broker hands it out.
///
/// A message may be delivered many times (after an ack wait lapses, a
/// channel closes, a consumer dies); each delivery is its own value. The
/// settling methods are each called at most once per delivery, and only by
/// the consumer loop, after idem has recorded (or replayed) the message's
/// outcome.
#[async_trait]
pub trait Delivery: Send + Sync + fmt::Debug {
    /// The id the producer gave the message, if it gave one: the
    /// `Nats-Msg-Id` header, the AMQP `message_id` property, the entry's
    /// `id` field. Redeliveries and duplicate publishes share it.
    fn message_id(&self) -> Option<&str>;

    /// The message's body.
    fn payload(&self) -> &[u8];

    /// Which delivery of this message this is, as far as the broker tells
    /// (1 for the first).
    fn delivery_count(&self) -> u32;

    /// The broker's own name for this delivery (a stream sequence, a
    /// delivery tag, an entry id): for logs.
    fn locator(&self) -> String;

    /// Acknowledges the message for good: the broker never delivers it
    /// again.
    async fn ack(&self) -> Result<(), BrokerError>;

    /// Hands the message back to be delivered again, after `delay` where the
    /// broker can delay a redelivery.
    async fn retry(&self, delay: Duration) -> Result<(), BrokerError>;

    /// Parks the message where dead letters go (a subject, a queue, a
    /// stream) with `reason`, and settles this delivery so it is not
    /// delivered again.
    async fn dead_letter(&self, reason: &str) -> Result<(), BrokerError>;

    /// Tells the broker the message is still being worked on, so it is not
    /// redelivered to another consumer meanwhile.
    async fn in_progress(&self) -> Result<(), BrokerError>;
}

/// Where deliveries come from: a pull consumer, a queue subscription, a
/// consumer group.
#[async_trait]
pub trait Source: Send + fmt::Debug {
    /// The next delivery, waiting up to `wait` for one; `None` when none
    /// came in time.
    async fn next(&mut self, wait: Duration) -> Result<Option<Box<dyn Delivery>>, BrokerError>;

    /// How often a running handler's delivery must be kept alive with
    /// [`Delivery::in_progress`], or `None` when the broker does not take
    /// deliveries back from a live consumer.
    fn heartbeat(&self) -> Option<Duration>;
}

#[async_trait]
impl<S: Source + ?Sized> Source for Box<S> {
    async fn next(&mut self, wait: Duration) -> Result<Option<Box<dyn Delivery>>, BrokerError> {
        (**self).next(wait).await
    }

    fn heartbeat(&self) -> Option<Duration> {
        (**self).heartbeat()
    }
}
