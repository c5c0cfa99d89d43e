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

use redis::{Cmd, Pipeline, Value};

use idem_core::store::{NewRecord, Record, StoreError, Token};

use crate::connection::{command, Script};
use crate::error::{failed, unexpected};
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
    /// Runs `first` and then `PTTL` on `key` in one transaction and decodes
    /// what `first` found: `None` when it found no value.
    pub(crate) async fn read_with_ttl(
        &self,
        key: &[u8],
        first: Cmd,
    ) -> Result<Option<Record>, StoreError> {
        let mut pttl = command("PTTL", 1, key.len());
        pttl.arg(key);
        let mut transaction = Pipeline::with_capacity(2);
        transaction.atomic().add_command(first).add_command(pttl);
        let reply = self
            .connection
            .transaction(&transaction)
            .await
            .map_err(|e| failed(key, e))?;
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
        let reply = script
            .run(&*self.connection, &call)
            .await
            .map_err(|e| failed(key, e))?;
        match reply {
            Value::Int(1) => Ok(true),
            Value::Int(0) => Ok(false),
            Value::BulkString(value) => Err(crate::error::refused(key, value)),
            other => Err(unexpected(other)),
        }
    }
}
