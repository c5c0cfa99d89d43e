//! What a call to DynamoDB can fail with, and how it becomes a
//! [`StoreError`].

use idem_core::store::StoreError;
use serde_json::Value;

use crate::BACKEND;

/// A call to DynamoDB that failed: kept as the [`StoreError`]'s source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DynamoError {
    /// The request did not reach DynamoDB, or its reply was cut off.
    #[error("no reply from DynamoDB: {0}")]
    Transport(#[source] reqwest::Error),
    /// DynamoDB refused the call (throttling past the retries included).
    #[error("DynamoDB answered {status} {kind}: {message}")]
    Service {
        /// The HTTP status.
        status: u16,
        /// The error type, such as `ProvisionedThroughputExceededException`.
        kind: String,
        /// DynamoDB's message.
        message: String,
        /// The item a failed condition found
        /// (`ReturnValuesOnConditionCheckFailure = ALL_OLD`).
        #[doc(hidden)]
        item: Option<Value>,
    },
    /// DynamoDB answered something that is not its JSON protocol.
    #[error("DynamoDB answered HTTP {status} with a body that is not JSON: {problem}")]
    Reply {
        /// The HTTP status.
        status: u16,
        /// What is wrong with the body.
        problem: String,
    },
}

impl DynamoError {
    /// Whether a condition expression failed: the one refusal the store
    /// expects, which it turns into its answer.
    pub(crate) fn condition_failed(&self) -> bool {
        matches!(self, DynamoError::Service { kind, .. } if kind == "ConditionalCheckFailedException")
    }

    /// Whether DynamoDB throttled the call (and the retries ran out).
    pub fn is_throttling(&self) -> bool {
        matches!(self, DynamoError::Service { kind, .. }
            if kind == "ProvisionedThroughputExceededException"
                || kind == "ThrottlingException"
                || kind == "RequestLimitExceeded")
    }
}

impl From<DynamoError> for StoreError {
    fn from(error: DynamoError) -> StoreError {
        match &error {
            DynamoError::Service { kind, .. } if kind == "ResourceNotFoundException" => {
                StoreError::config(BACKEND, error)
            }
            _ => StoreError::backend(BACKEND, error),
        }
    }
}

/// A record that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("item {key:?}: {problem}")]
pub(crate) struct Corrupt {
    pub(crate) key: String,
    pub(crate) problem: String,
}

pub(crate) fn corrupt(key: &str, problem: impl Into<String>) -> StoreError {
    StoreError::corrupt(
        BACKEND,
        Corrupt {
            key: key.to_owned(),
            problem: problem.into(),
        },
    )
}
