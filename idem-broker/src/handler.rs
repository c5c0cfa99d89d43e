//! What the consumer runs for each message.

use async_trait::async_trait;
pub use idem_inbox::HandlerError;

/// One message as the handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// The idempotency key it runs under (its message id, or what the
    /// consumer's key extractor derived).
    pub key: String,
    /// Its body.
    pub payload: Vec<u8>,
    /// Which delivery this is (1 for the first).
    pub delivery: u32,
}

impl Message {
    /// Delivery 1 of a message under `key`.
    pub fn new(key: impl Into<String>, payload: impl Into<Vec<u8>>) -> Message {
        Message {
            key: key.into(),
            payload: payload.into(),
            delivery: 1,
        }
    }
}

/// Handles messages. Runs under idem's `execute` keyed by the message's
/// key: once it returns `Ok` for a key, every later delivery of that key
/// replays the recorded success and is acked without running it again.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles `message`.
    async fn handle(&self, message: &Message) -> Result<(), HandlerError>;
}

#[async_trait]
impl<F, Fut> Handler for F
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), HandlerError>> + Send,
{
    async fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        self(message.clone()).await
    }
}
