//! The raw minimal protocol, by hand: the baseline `execute` is measured
//! against. Not part of the store's API.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};

use idem_core::store::Token;
use idem_core::Fingerprint;

use crate::connection::{Script, Shared};
use crate::RedisStore;

static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/raw_complete.lua")));

const IN_FLIGHT: u8 = 0;
const COMPLETED: u8 = 1;

/// The least a correct client can do, each step one round trip:
///
/// * claim: `SET key value NX GET PX lease` — insert unless a live value is
///   there, else return that value; a crashed owner's claim expires with
///   its lease;
/// * complete: a compare-and-set on the token (a five-line script) that
///   writes the outcome with the retention as expiry.
///
/// The value is state (1 byte), token (16), fingerprint (32), payload.
/// No renewal, no takeover, no layout version: a baseline, not a store.
#[derive(Clone)]
pub struct RawProtocol {
    connection: Arc<dyn Shared>,
    prefix: Arc<[u8]>,
}

impl std::fmt::Debug for RawProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawProtocol").finish_non_exhaustive()
    }
}

/// What a raw claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawClaim {
    /// The key was free and is now held under this token.
    Claimed(Token),
    /// Another request's fingerprint is there.
    Mismatch,
    /// The key is held by a running owner.
    InProgress,
    /// The outcome is recorded: here it is.
    Replay(Vec<u8>),
}

impl RawProtocol {
    /// The raw protocol on the same connection and prefix as `store`.
    pub fn new(store: &RedisStore) -> RawProtocol {
        RawProtocol {
            connection: Arc::clone(&store.connection),
            prefix: Arc::clone(&store.prefix),
        }
    }

    /// The raw protocol on its own connection.
    pub fn from_connection<C>(connection: C, prefix: &str) -> RawProtocol
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        RawProtocol {
            connection: Arc::new(connection),
            prefix: Arc::from(prefix.as_bytes()),
        }
    }

    fn key(&self, key: &str) -> Vec<u8> {
        [&self.prefix[..], key.as_bytes()].concat()
    }

    /// Claims `key` for `lease`, or reads what holds it.
    pub async fn claim(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> RedisResult<RawClaim> {
        let (cmd, token) = self.claim_cmd(key, fingerprint, lease);
        self.found(self.connection.query(&cmd).await?, token, fingerprint)
    }

    /// Like [`claim`](RawProtocol::claim), and reads the key's `PTTL` in
    /// the same `MULTI … EXEC`, as a store must to report the time left:
    /// the price of that report, measured apart.
    pub async fn claim_with_ttl(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> RedisResult<(RawClaim, i64)> {
        let (cmd, token) = self.claim_cmd(key, fingerprint, lease);
        let mut transaction = redis::pipe();
        transaction
            .atomic()
            .add_command(cmd)
            .cmd("PTTL")
            .arg(self.key(key));
        match self.connection.transaction(&transaction).await? {
            Value::Array(replies) => match <[Value; 2]>::try_from(replies) {
                Ok([found, Value::Int(pttl)]) => Ok((self.found(found, token, fingerprint)?, pttl)),
                _ => Err(not_raw("a transaction reply of another shape")),
            },
            other => Err(not_raw(format!("{other:?}"))),
        }
    }

    fn claim_cmd(
        &self,
        key: &str,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> (redis::Cmd, Token) {
        let token = Token::random();
        let value = [&[IN_FLIGHT][..], token.as_bytes(), fingerprint.as_bytes()].concat();
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.key(key))
            .arg(value)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(lease.as_millis().max(1) as u64);
        (cmd, token)
    }

    fn found(
        &self,
        reply: Value,
        token: Token,
        fingerprint: &Fingerprint,
    ) -> RedisResult<RawClaim> {
        Ok(match reply {
            Value::Nil => RawClaim::Claimed(token),
            Value::BulkString(found) if found.len() >= 49 => {
                if found[17..49] != fingerprint.as_bytes()[..] {
                    RawClaim::Mismatch
                } else if found[0] == COMPLETED {
                    RawClaim::Replay(found[49..].to_vec())
                } else {
                    RawClaim::InProgress
                }
            }
            other => return Err(not_raw(format!("{other:?}"))),
        })
    }

    /// Records `payload` under `key` if `token` still holds it.
    pub async fn complete(
        &self,
        key: &str,
        token: Token,
        fingerprint: &Fingerprint,
        payload: &[u8],
        retention: Duration,
    ) -> RedisResult<bool> {
        let value = [
            &[COMPLETED][..],
            token.as_bytes(),
            fingerprint.as_bytes(),
            payload,
        ]
        .concat();
        let mut call = COMPLETE.call(&self.key(key), value.len() + 40);
        call.arg(&token.as_bytes()[..])
            .arg(value)
            .arg(retention.as_millis().max(1) as u64);
        Ok(COMPLETE.run(&*self.connection, &call).await? == Value::Int(1))
    }
}

fn not_raw(what: impl Into<String>) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "not a raw protocol value",
        what.into(),
    ))
}
