//! The `Store` implementation: one round trip per method, two for a
//! claim that finds a record in flight.
//!
//! `insert` is a bare `SET … NX GET PX`: it inserts, or returns what it
//! found. A completed or failed record found is answered from that value
//! alone (its retention left is not read: the store contract allows a
//! lower bound there, and idem decides nothing on it). A record found in
//! flight needs its lease left, so the claim is sent again inside a
//! `MULTI … EXEC` with `PTTL`, atomic, which also inserts if the key was
//! freed in between. `load` is the same transaction around `GET`. `swap`,
//! `take_over` and `remove` are compare-and-sets on the token and need a
//! script each.

use async_trait::async_trait;
use redis::{Cmd, Pipeline, Value};

use idem_core::store::{Insert, NewRecord, Record, State, Store, StoreError, Token};

use crate::connection::{command, Script};
use crate::error::{failed, unexpected};
use crate::record::{self, Encoded};
use crate::scripts::SCRIPTS;
use crate::RedisStore;

/// The `PTTL` a settled record found by a bare claim is decoded with: its
/// retention is reported as the least above zero, a lower bound.
const SETTLED_FOUND_PTTL: i64 = 0;

/// A claim of `key`: `SET key value NX GET PX retention`.
fn claim_command(key: &[u8], encoded: &Encoded<'_>) -> Cmd {
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
    async fn read_with_ttl(&self, key: &[u8], first: Cmd) -> Result<Option<Record>, StoreError> {
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
    async fn compare_and_set(
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

#[async_trait]
impl Store for RedisStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let key = self.redis_key(key);
        let encoded = Encoded::new(record);
        let reply = self
            .connection
            .query(&claim_command(&key, &encoded))
            .await
            .map_err(|e| failed(&key, e))?;
        let found = match reply {
            Value::Nil => return Ok(Insert::Inserted),
            Value::BulkString(value) => record::decode(&key, value, SETTLED_FOUND_PTTL)?,
            other => return Err(unexpected(other)),
        };
        let found = if found.state == State::InFlight && found.token != record.token {
            // Its lease left decides between waiting and taking over: claim
            // again with the key's `PTTL` in one transaction.
            match self
                .read_with_ttl(&key, claim_command(&key, &encoded))
                .await?
            {
                None => return Ok(Insert::Inserted),
                Some(found) => found,
            }
        } else {
            found
        };
        Ok(if found.token == record.token {
            // Only this call holds its new token: finding it means a resent
            // request (a cluster client resends after a timeout) found what
            // its first attempt inserted.
            Insert::Inserted
        } else {
            Insert::Found(found)
        })
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let key = self.redis_key(key);
        // Renewals publish nothing: only an outcome wakes waiters.
        let publish = self
            .channel
            .as_deref()
            .filter(|_| record.state != State::InFlight);
        self.compare_and_set(&SCRIPTS.swap, &key, Some(record), expected, publish)
            .await
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let key = self.redis_key(key);
        self.compare_and_set(&SCRIPTS.take_over, &key, Some(record), expected, None)
            .await
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let key = self.redis_key(key);
        let publish = self.channel.as_deref();
        self.compare_and_set(&SCRIPTS.remove, &key, None, expected, publish)
            .await
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let key = self.redis_key(key);
        let mut get = command("GET", 1, key.len());
        get.arg(&key);
        self.read_with_ttl(&key, get).await
    }

    /// Always `Ok(0)`: every record's key carries its retention as a Redis
    /// expiry, so Redis deletes expired records itself and a scan would
    /// find nothing to do.
    async fn purge_expired(&self, _limit: usize) -> Result<usize, StoreError> {
        Ok(0)
    }

    fn wakeups(&self) -> Option<std::sync::Arc<idem_core::store::Wakeups>> {
        self.wake_ups()
    }
}
