//! What a broker failure looks like.

/// A broker failed. Whether the operation applied is unknown when the
/// failure came after the request was sent; the consumer never acks in
/// that case, so the worst outcome is a redelivery that idem replays.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The broker or its client failed.
    #[error("{broker} failed: {source}")]
    Broker {
        /// Which broker: `"nats"`, `"amqp"`, `"redis-streams"`.
        broker: &'static str,
        /// What its client reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The broker answered with something this crate cannot read.
    #[error("{broker} sent a reply this consumer cannot read: {reason}")]
    Protocol {
        /// Which broker.
        broker: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A name or option given to the consumer is not acceptable.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
}

impl BrokerError {
    #[allow(dead_code)]
    pub(crate) fn broker(
        broker: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> BrokerError {
        BrokerError::Broker {
            broker,
            source: source.into(),
        }
    }
}
