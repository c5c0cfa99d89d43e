//! The store's errors: what a failed command, an unexpected reply and a
//! value that is not a record become, each a [`StoreError`] that says which.

use std::error::Error as StdError;
use std::fmt;

use idem_core::store::{ParseError, StoreError};
use redis::{RedisError, Value};

use crate::connection::is_wrong_type;
use crate::record::{BACKEND, VERSION_EXPIRING, VERSION_SCHEMED};

/// A command's error: a key holding another Redis type is a corrupt record,
/// anything else a backend failure.
pub(crate) fn failed(key: &[u8], error: RedisError) -> StoreError {
    if is_wrong_type(&error) {
        wrong_type(key, error)
    } else {
        StoreError::backend(BACKEND, error)
    }
}

/// A write to `key` that fewer replicas than the store waits for
/// acknowledged in time: applied on the master, and not known to survive
/// its failover.
pub(crate) fn too_few_replicas(key: &[u8], wanted: u32, acks: i64) -> StoreError {
    StoreError::backend(
        BACKEND,
        TooFewReplicas {
            key: String::from_utf8_lossy(key).into_owned(),
            wanted,
            acks: acks.max(0),
        },
    )
}

/// A write fewer replicas acknowledged than the store waits for.
#[derive(Debug)]
struct TooFewReplicas {
    key: String,
    wanted: u32,
    acks: i64,
}

impl fmt::Display for TooFewReplicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the write to {} reached {} of the {} replicas the store waits for in time; \
             it is applied on the master but may be lost if the master fails over",
            self.key, self.acks, self.wanted
        )
    }
}

impl StdError for TooFewReplicas {}

/// A reply the store never asks for.
pub(crate) fn unexpected(reply: Value) -> StoreError {
    StoreError::backend(BACKEND, UnexpectedReply(format!("{reply:?}")))
}

/// The server answered something the store never asks for: another script
/// under the same name, or a mangled reply.
#[derive(Debug)]
struct UnexpectedReply(String);

impl std::fmt::Display for UnexpectedReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unexpected reply {}", self.0)
    }
}

impl std::error::Error for UnexpectedReply {}

/// The error for a value the scripts refused to touch.
pub(crate) fn refused(key: &[u8], value: Vec<u8>) -> StoreError {
    let clock = crate::record::Clock { now_ms: 0, pttl: 1 };
    match crate::record::decode(key, value, clock) {
        Err(error) => error,
        // The scripts and this decoder disagree: still refuse, loudly.
        Ok(_) => StoreError::corrupt(BACKEND, CorruptRecord::new(key, Problem::Refused)),
    }
}

/// The error for a key that holds another Redis type than a string.
pub(crate) fn wrong_type(key: &[u8], source: redis::RedisError) -> StoreError {
    StoreError::corrupt(
        BACKEND,
        CorruptRecord::new(key, Problem::WrongType(source.to_string())),
    )
}

/// The value under a key is not a record this build can read.
#[derive(Debug)]
pub(crate) struct CorruptRecord {
    key: String,
    problem: Problem,
}

impl CorruptRecord {
    pub(crate) fn new(key: &[u8], problem: Problem) -> CorruptRecord {
        CorruptRecord {
            key: String::from_utf8_lossy(key).into_owned(),
            problem,
        }
    }
}

#[derive(Debug)]
pub(crate) enum Problem {
    Truncated { len: usize, need: usize },
    Version(u8),
    State(u8),
    Parse(ParseError),
    Refused,
    WrongType(String),
}

impl fmt::Display for CorruptRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the value under Redis key {:?} ", self.key)?;
        match &self.problem {
            Problem::Truncated { len, need } => write!(
                f,
                "is {len} bytes long, shorter than the {need} bytes of a record header"
            ),
            Problem::Version(v) => write!(
                f,
                "has record layout version {v}; this build reads versions {VERSION_EXPIRING} to {VERSION_SCHEMED}"
            ),
            Problem::Parse(e) => write!(f, "is not a record: {e}"),
            Problem::State(s) => write!(f, "has unknown state byte {s}"),
            Problem::Refused => write!(f, "was refused by the store's script as not a record"),
            Problem::WrongType(e) => write!(f, "is not a Redis string ({e})"),
        }?;
        write!(f, "; it was left untouched")
    }
}

impl StdError for CorruptRecord {}
