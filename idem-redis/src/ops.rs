//! What the `Store` methods of [`RedisStore`] send: the claim command, the
//! transaction that reads a value with its `PTTL`, and the compare-and-set
//! script calls, with their replies decoded.
//!
//! `insert` is a bare `SET … NX GET PX` ([`claim_command`]): it inserts,
//! or returns what it found. A completed or failed record found is
//! answered from that value alone (its retention left is not read: the
//! store contract allows a lower bound there, and idem decides nothing on
//! it). A record found in flight needs its lease left, so the claim is
//! sent again inside a `MULTI … EXEC` with `PTTL`
//! ([`RedisStore::read_with_ttl`]), atomic, which also inserts if the key
//! was freed in between. `load` is the same transaction around `GET`.
//! `swap`, `take_over` and `remove` are compare-and-sets on the token and
//! need a script each ([`RedisStore::compare_and_set`]).

use redis::{Cmd, Pipeline, RedisResult, Value};

use idem_core::store::{NewRecord, Record, StoreError, Token};

use crate::connection::{command, is_no_script, Script};
use crate::error::{failed, too_few_replicas, unexpected};
use crate::record::{self, Encoded};
use crate::RedisStore;

/// The `PTTL` a settled record found by a bare claim is decoded with: its
/// retention is reported as the least above zero, a lower bound.
pub(crate) const SETTLED_FOUND_PTTL: i64 = 0;

/// A claim of `key`: `SET key value NX GET PX retention`.
pub(crate) fn claim_command(key: &[u8], encoded: &Encoded<'_>) -> Cmd {
    let mut set = command("SET", 6, key.len() + encoded.len() + 16);
    set.arg(key)
        .arg(encoded)
        .arg("NX")
        .arg("GET")
        .arg("PX")
        .arg(encoded.retention_ms);
    set
}

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

    /// Runs `first` and then `PTTL` on `key` in one transaction and decodes
    /// what `first` found: `None` when it found no value.
    pub(crate) async fn read_with_ttl(
        &self,
        key: &[u8],
        first: Cmd,
    ) -> Result<Option<Record>, StoreError> {
        self.transaction_with_ttl(key, first, None).await
    }

    /// [`read_with_ttl`](RedisStore::read_with_ttl) of a command that may
    /// write: followed by the store's `WAIT` when it waits for replicas,
    /// and checked with [`replicated`](RedisStore::replicated) when
    /// `changed` says, from what was found, that the command wrote.
    pub(crate) async fn write_with_ttl(
        &self,
        key: &[u8],
        first: Cmd,
        changed: impl Fn(Option<&Record>) -> bool + Sync,
    ) -> Result<Option<Record>, StoreError> {
        self.transaction_with_ttl(key, first, Some(&changed)).await
    }

    async fn transaction_with_ttl(
        &self,
        key: &[u8],
        first: Cmd,
        changed: Option<&Changed<'_>>,
    ) -> Result<Option<Record>, StoreError> {
        let mut pttl = command("PTTL", 1, key.len());
        pttl.arg(key);
        let (reply, acks) = match changed.and_then(|_| self.wait_command()) {
            None => {
                let mut transaction = Pipeline::with_capacity(2);
                transaction.atomic().add_command(first).add_command(pttl);
                let reply = self
                    .connection
                    .transaction(&transaction)
                    .await
                    .map_err(|e| failed(key, e))?;
                (reply, None)
            }
            Some(wait) => {
                // `WAIT` does not block inside `MULTI`: the transaction is
                // spelled out, and the `WAIT` follows its `EXEC` in the
                // same write on the same connection.
                let mut pipeline = Pipeline::with_capacity(5);
                pipeline
                    .add_command(redis::cmd("MULTI"))
                    .add_command(first)
                    .add_command(pttl)
                    .add_command(redis::cmd("EXEC"))
                    .add_command(wait);
                let reply = self
                    .connection
                    .transaction(&pipeline)
                    .await
                    .map_err(|e| failed(key, e))?;
                let Value::Array(replies) = reply else {
                    return Err(unexpected(reply));
                };
                match <[Value; 5]>::try_from(replies) {
                    Ok([_, _, _, exec, acks]) => (
                        exec.extract_error().map_err(|e| failed(key, e))?,
                        Some(acks_of(&acks)),
                    ),
                    Err(replies) => return Err(unexpected(Value::Array(replies))),
                }
            }
        };
        let found = decode_with_ttl(key, reply)?;
        if changed.is_some_and(|changed| changed(found.as_ref())) {
            self.replicated(key, acks)?;
        }
        Ok(found)
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
            encoded.as_ref().map_or(0, Encoded::len) + 40 + publish_len,
        );
        if let Some(encoded) = &encoded {
            call.arg(encoded).arg(encoded.retention_ms);
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

/// Whether a command wrote, told from what it found.
type Changed<'a> = dyn Fn(Option<&Record>) -> bool + Sync + 'a;

/// The replies of a `MULTI … EXEC` of a command and `PTTL`, decoded: what
/// the command found, `None` when it found no value.
fn decode_with_ttl(key: &[u8], reply: Value) -> Result<Option<Record>, StoreError> {
    let Value::Array(replies) = reply else {
        return Err(unexpected(reply));
    };
    match <[Value; 2]>::try_from(replies) {
        Ok([Value::Nil, _]) => Ok(None),
        Ok([Value::BulkString(value), Value::Int(pttl)]) => {
            record::decode(key, value, pttl).map(Some)
        }
        Ok([first, _]) => Err(unexpected(first)),
        Err(replies) => Err(unexpected(Value::Array(replies))),
    }
}

/// The replicas a `WAIT` reply counts; anything but a number counts none.
fn acks_of(reply: &Value) -> i64 {
    match reply {
        Value::Int(acks) => *acks,
        _ => -1,
    }
}
