//! What a request can end in, other than a final response.

use std::time::Duration;

use idem_core::KeyError;

use crate::{IdempotencyKey, Response};

/// A logical request that did not end in a final response.
///
/// A final response, success or refusal (any 2xx–4xx that is not retried),
/// is `Ok`: read its status as with reqwest. Each variant says whether the
/// server may have acted on the request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key given is not 1–255 visible ASCII characters; nothing was sent.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[from] KeyError),
    /// The key cannot be written in a header; nothing was sent.
    #[error("the idempotency key cannot be sent in a header: {0}")]
    KeyHeader(#[from] http::header::InvalidHeaderValue),
    /// The body could not be encoded as JSON; nothing was sent.
    #[error("the request body does not encode as JSON: {0}")]
    Encode(#[from] serde_json::Error),
    /// The request could not be built (a bad URL or header); nothing was
    /// sent.
    #[error("the request cannot be built: {0}")]
    Build(#[source] reqwest::Error),
    /// The server refused the key because it was used before with another
    /// request (`422`). This is a bug in the caller: one key must name one
    /// intent, with the same body every time. The earlier request under the
    /// key may well have run.
    #[error("the idempotency key {key} was already used for a different request")]
    KeyReused {
        /// The key the server refused.
        key: IdempotencyKey,
        /// The server's answer.
        response: Box<Response>,
    },
    /// The request failed in transport and may not be retried (it carries
    /// no key and was not marked safe to retry). It may have reached the
    /// server and run.
    #[error("the request failed and is not safe to retry: {0}")]
    Transport(#[source] reqwest::Error),
    /// Every attempt the budget allowed failed in a way worth retrying (for
    /// a request that may not be retried: its one attempt timed out). With a
    /// key the request ran at most once, and sending it again under the same
    /// key later is still safe.
    #[error("gave up after {attempts} attempts in {elapsed:?}: {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// Time from the first attempt until giving up.
        elapsed: Duration,
        /// The last attempt's failure.
        last: Box<Failure>,
    },
}

/// How an attempt that is worth retrying failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// The server answered with a status worth retrying (5xx, 408, 409,
    /// 429).
    #[error("the server answered {}", .0.status())]
    Status(Box<Response>),
    /// No complete response came within the attempt's timeout.
    #[error("no complete response within {0:?}")]
    TimedOut(Duration),
    /// The connection could not be made, or broke before the response was
    /// complete.
    #[error("transport failed: {0}")]
    Transport(#[source] reqwest::Error),
}
