//! The raw minimal protocol, for benchmarks: the bare claim and complete
//! statements, through the same writer thread as the store's operations.

use std::time::Duration;

use idem_core::store::{State, StoreError, Token};
use rusqlite::{params, Connection};

use crate::ops::{after, Done, Op, OpError, CLAIM};
use crate::store::unexpected;
use crate::SqliteStore;

impl SqliteStore {
    /// Claims `key` for `token` with the bare claim statement, or returns
    /// the payload already stored under it. No fingerprint, no decoding:
    /// the floor that [`Store::insert`](idem_core::store::Store::insert) is
    /// measured against.
    #[doc(hidden)]
    pub async fn raw_claim(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
        retention: Duration,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let op = Op::Raw(RawOp::Claim {
            key: key.to_owned(),
            token,
            lease,
            retention,
        });
        match self.call(op).await? {
            Done::Claimed(found) => Ok(found),
            other => Err(unexpected(other)),
        }
    }

    /// Records `payload` as the completed outcome of `key` if `token` holds
    /// it, with the bare update statement.
    #[doc(hidden)]
    pub async fn raw_complete(
        &self,
        key: &str,
        token: Token,
        payload: &[u8],
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let op = Op::Raw(RawOp::Complete {
            key: key.to_owned(),
            token,
            payload: payload.to_vec(),
            retention,
        });
        match self.call(op).await? {
            Done::Changed(changed) => Ok(changed),
            other => Err(unexpected(other)),
        }
    }
}

const RAW_REPLAY: &str = "SELECT payload FROM idem_records WHERE key = ?1";

const RAW_COMPLETE: &str = "UPDATE idem_records SET state = 1, payload = ?1, \
    lease_until = NULL, retain_until = ?2 WHERE key = ?3 AND token = ?4";

/// The raw statements, run by the writer thread like the store's own.
#[derive(Debug)]
pub(crate) enum RawOp {
    Claim {
        key: String,
        token: Token,
        lease: Duration,
        retention: Duration,
    },
    Complete {
        key: String,
        token: Token,
        payload: Vec<u8>,
        retention: Duration,
    },
}

impl RawOp {
    /// Claims may go undone when nobody awaits them; completions may not.
    pub(crate) fn is_skippable(&self) -> bool {
        matches!(self, RawOp::Claim { .. })
    }

    /// Runs the statement inside the caller's open transaction.
    pub(crate) fn run(&self, conn: &Connection, now: i64) -> Result<Done, OpError> {
        match self {
            RawOp::Claim {
                key,
                token,
                lease,
                retention,
            } => {
                let claimed = conn.prepare_cached(CLAIM)?.execute(params![
                    key,
                    token.as_bytes(),
                    [0u8; 32],
                    State::InFlight.as_u8(),
                    [0u8; 0],
                    after(now, *lease),
                    after(now, *retention),
                    now,
                ])?;
                if claimed == 1 {
                    return Ok(Done::Claimed(None));
                }
                let payload = conn
                    .prepare_cached(RAW_REPLAY)?
                    .query_row(params![key], |row| row.get(0))?;
                Ok(Done::Claimed(Some(payload)))
            }
            RawOp::Complete {
                key,
                token,
                payload,
                retention,
            } => {
                let changed = conn.prepare_cached(RAW_COMPLETE)?.execute(params![
                    payload,
                    after(now, *retention),
                    key,
                    token.as_bytes(),
                ])?;
                Ok(Done::Changed(changed == 1))
            }
        }
    }
}
