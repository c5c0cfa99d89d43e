//! The raw minimal protocol, for benchmarks: the bare claim and complete
//! statements, through the same writer thread as the store's operations.

use std::time::Duration;

use idem_core::{StoreError, Token};

use crate::ops::{Done, Op};
use crate::store::unexpected;
use crate::SqliteStore;

impl SqliteStore {
    /// Claims `key` for `token` with the bare claim statement, or returns
    /// the payload already stored under it. No fingerprint, no decoding:
    /// the floor that [`Store::insert`](idem_core::Store::insert) is
    /// measured against.
    #[doc(hidden)]
    pub async fn raw_claim(
        &self,
        key: &str,
        token: Token,
        lease: Duration,
        retention: Duration,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let op = Op::RawClaim {
            key: key.to_owned(),
            token,
            lease,
            retention,
        };
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
        let op = Op::RawComplete {
            key: key.to_owned(),
            token,
            payload: payload.to_vec(),
            retention,
        };
        match self.call(op).await? {
            Done::Changed(changed) => Ok(changed),
            other => Err(unexpected(other)),
        }
    }
}
