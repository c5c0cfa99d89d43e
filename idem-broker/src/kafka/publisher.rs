//! The producer: Kafka's idempotence on, the idem key in a header.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use super::{broken, BROKER, KEY_HEADER};
use crate::BrokerError;

/// A producer with Kafka's idempotence on and every acknowledgement
/// awaited, from the application's config.
pub(super) fn producer(mut config: ClientConfig) -> Result<FutureProducer, BrokerError> {
    for consumer_only in ["group.id", "auto.offset.reset", "enable.auto.commit"] {
        config.remove(consumer_only);
    }
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .map_err(broken)
}

/// Publishes to one topic with the idem key in the [`KEY_HEADER`] header
/// and as the Kafka message key (so every publish of a key lands on one
/// partition, in order), on a producer with `enable.idempotence=true` and
/// `acks=all`.
///
/// Kafka's idempotence drops this producer's own retries within its
/// session; a publish repeated by a new session (a restart) or by the
/// caller (after a lost acknowledgement) gets a new offset, and the
/// consumer's idem key stops it there.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
    topic: String,
    timeout: Duration,
}

impl fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A publisher to `topic` on a producer made from `config`
    /// (`bootstrap.servers` and security; consumer settings are dropped).
    pub fn new(
        config: ClientConfig,
        topic: impl Into<String>,
    ) -> Result<KafkaPublisher, BrokerError> {
        let topic = topic.into();
        if topic.is_empty() {
            return Err(BrokerError::Config(
                "a Kafka topic name cannot be empty".to_owned(),
            ));
        }
        Ok(KafkaPublisher {
            producer: producer(config)?,
            topic,
            timeout: Duration::from_secs(30),
        })
    }

    /// Waits at most `timeout` for a publish to be acknowledged (default
    /// 30 s).
    pub fn with_timeout(mut self, timeout: Duration) -> KafkaPublisher {
        self.timeout = timeout;
        self
    }

    /// The producer, for anything else the application publishes on it.
    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// Publishes `payload` under idem key `key`; returns the partition and
    /// offset once every in-sync replica has it.
    pub async fn send(&self, key: &str, payload: &[u8]) -> Result<(i32, i64), BrokerError> {
        let headers = OwnedHeaders::new().insert(Header {
            key: KEY_HEADER,
            value: Some(key),
        });
        let record = FutureRecord::to(&self.topic)
            .key(key.as_bytes())
            .payload(payload)
            .headers(headers);
        let delivered = self
            .producer
            .send(record, self.timeout)
            .await
            .map_err(|(e, _)| broken(e))?;
        Ok((delivered.partition, delivered.offset))
    }
}

#[async_trait]
impl crate::enqueue::Publish for KafkaPublisher {
    fn broker(&self) -> &'static str {
        BROKER
    }

    async fn publish(&self, id: &str, payload: &[u8]) -> Result<String, BrokerError> {
        let (partition, offset) = self.send(id, payload).await?;
        Ok(format!("{}/{partition}/{offset}", self.topic))
    }
}
