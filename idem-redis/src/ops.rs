//! What the `Store` methods of [`RedisStore`] send: the scripts that read
//! or write one record each, and the `WAIT` that follows a write when the
//! store waits for replicas.
//!
//! `insert` is one script (`lua/claim.lua`): it inserts, or returns what
//! it found with the server's clock (and, for a record of layouts 1 or 2,
//! its key's `PTTL`), so a claim that finds a record in flight knows its
//! lease left in the same round trip. `load` is the same read without the
//! write. `swap`, `take_over` and `remove` are compare-and-sets on the
//! token ([`RedisStore::compare_and_set`]).

use redis::{Cmd, Pipeline, RedisResult, Value};

use idem_core::store::{NewRecord, Record, StoreError, Token};

use crate::connection::{command, is_no_script, Script};
use crate::error::{failed, too_few_replicas, unexpected};
use crate::record::{self, Clock, Encoded};
use crate::RedisStore;

impl RedisStore {
    /// `WAIT` for the replicas the store waits for, if it does.
    fn wait_command(&self) -> Option<Cmd> {
        self.replica_acks.map(|acks| {
            let mut wait = command("WAIT", 2, 24);
            wait.arg(acks.replicas).arg(acks.timeout_ms);
            wait
        })
    }

    /// Sends `write`, followed in the same write on the same connection by
    /// the store's `WAIT` when it waits for replicas: the write's reply, and
    /// how many replicas acknowledged it (`None` when the store does not
    /// wait).
    pub(crate) async fn write(&self, write: &Cmd) -> RedisResult<(Value, Option<i64>)> {
        let Some(wait) = self.wait_command() else {
            return Ok((self.connection.query(write).await?, None));
        };
        let mut pipeline = Pipeline::with_capacity(2);
        pipeline.add_command(write.clone()).add_command(wait);
        match self.connection.transaction(&pipeline).await? {
            Value::Array(replies) => match <[Value; 2]>::try_from(replies) {
                Ok([reply, acks]) => Ok((reply.extract_error()?, Some(acks_of(&acks)))),
                Err(replies) => Ok((Value::Array(replies), Some(-1))),
            },
            other => Ok((other, Some(-1))),
        }
    }

    /// [`write`](RedisStore::write) of a script call; a server that does
    /// not know the script gets it loaded and the call sent again.
    pub(crate) async fn write_script(
        &self,
        script: &Script,
        call: &Cmd,
    ) -> RedisResult<(Value, Option<i64>)> {
        match self.write(call).await {
            Err(error) if is_no_script(&error) => {
                self.connection.query(&script.load()).await?;
                self.write(call).await
            }
            reply => reply,
        }
    }

    /// Runs a script call that writes no record (no `WAIT` after it); a
    /// server that does not know the script gets it loaded and the call
    /// sent again.
    pub(crate) async fn run_script(&self, script: &Script, call: &Cmd) -> RedisResult<Value> {
        match self.connection.query(call).await {
            Err(error) if is_no_script(&error) => {
                self.connection.query(&script.load()).await?;
                self.connection.query(call).await
            }
            reply => reply,
        }
    }

    /// Whether a write that changed `key` reached the replicas the store
    /// waits for: `acks` is what [`write`](RedisStore::write) returned.
    pub(crate) fn replicated(&self, key: &[u8], acks: Option<i64>) -> Result<(), StoreError> {
        match (self.replica_acks, acks) {
            (Some(wanted), Some(acks)) if acks < i64::from(wanted.replicas) => {
                Err(too_few_replicas(key, wanted.replicas, acks))
            }
            _ => Ok(()),
        }
    }

    /// A script that reads the record under `key` (`claim` or `load`),
    /// decoded from its reply: `None` when it found none (`claim`: and
    /// inserted `ARGV[1]`), else the live record it found.
    pub(crate) fn found(key: &[u8], reply: Value) -> Result<Option<Record>, StoreError> {
        match reply {
            Value::Int(0) => Ok(None),
            Value::Array(parts) => match <[Value; 3]>::try_from(parts) {
                Ok([Value::BulkString(value), Value::Int(now_ms), Value::Int(pttl)]) => {
                    record::decode(key, value, Clock { now_ms, pttl }).map(Some)
                }
                Ok(parts) => Err(unexpected(Value::Array(parts.into()))),
                Err(parts) => Err(unexpected(Value::Array(parts))),
            },
            Value::BulkString(value) => Err(crate::error::refused(key, value)),
            other => Err(unexpected(other)),
        }
    }

    /// A compare-and-set script on `key`: the new value and its retention
    /// when there is one, then the expected token, then the channel to
    /// publish an outcome or a release on, if any.
    pub(crate) async fn compare_and_set(
        &self,
        script: &Script,
        key: &[u8],
        record: Option<&NewRecord<'_>>,
        expected: Token,
        publish: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        let encoded = record.map(Encoded::new);
        let publish_len = publish.map_or(0, <[u8]>::len);
        let mut call = script.call(
            key,
            encoded.as_ref().map_or(0, Encoded::len) + 24 + publish_len,
        );
        if let Some(encoded) = &encoded {
            call.arg(encoded);
        }
        call.arg(&expected.as_bytes()[..]);
        if let Some(channel) = publish {
            call.arg(channel);
        }
        let (reply, acks) = self
            .write_script(script, &call)
            .await
            .map_err(|e| failed(key, e))?;
        match reply {
            Value::Int(1) => {
                self.replicated(key, acks)?;
                Ok(true)
            }
            Value::Int(0) => Ok(false),
            Value::BulkString(value) => Err(crate::error::refused(key, value)),
            other => Err(unexpected(other)),
        }
    }
}

/// The replicas a `WAIT` reply counts; anything but a number counts none.
fn acks_of(reply: &Value) -> i64 {
    match reply {
        Value::Int(acks) => *acks,
        _ => -1,
    }
}
