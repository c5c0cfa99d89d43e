//! The raw minimal protocol, by hand: the claim statement and the
//! token-conditioned complete, with nothing of idem around them. Benchmarks
//! compare `execute` against it on the same pool; it is not an API.

use std::time::Duration;

use sqlx::Row;

use crate::row::micros;
use crate::MySqlStore;

/// What the bare claim statement returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The key was free and is now claimed with the caller's token.
    Inserted,
    /// A live record holds the key: its state code and payload.
    Found {
        /// 0 in flight, 1 completed, 2 failed.
        state: i8,
        /// The stored payload.
        payload: Vec<u8>,
    },
}

/// Runs the claim statement of `store` for `key` with an in-flight record.
pub async fn claim(
    store: &MySqlStore,
    key: &str,
    token: &[u8; 16],
    fingerprint: &[u8; 32],
    lease: Duration,
    retention: Duration,
) -> Result<Claimed, sqlx::Error> {
    let row = sqlx::query(&store.statements().insert)
        .bind(key)
        .bind(&token[..])
        .bind(&fingerprint[..])
        .bind(0_u8)
        .bind(&[] as &[u8])
        .bind(micros(lease))
        .bind(micros(retention))
        .fetch_one(store.pool())
        .await?;
    let stored: &[u8] = row.try_get(0)?;
    if stored == &token[..] {
        Ok(Claimed::Inserted)
    } else {
        Ok(Claimed::Found {
            state: row.try_get(2)?,
            payload: row.try_get(3)?,
        })
    }
}

/// Runs the complete statement of `store`: records `payload` as completed
/// if `token` still owns `key`. Returns whether it did.
pub async fn complete(
    store: &MySqlStore,
    key: &str,
    token: &[u8; 16],
    fingerprint: &[u8; 32],
    payload: &[u8],
    retention: Duration,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(&store.statements().swap)
        .bind(&token[..])
        .bind(&fingerprint[..])
        .bind(1_u8)
        .bind(payload)
        .bind(None::<i64>)
        .bind(micros(retention))
        .bind(key)
        .bind(&token[..])
        .execute(store.pool())
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The token-conditioned complete statement of `store` on `tx`, which the
/// caller holds inside its own transaction: the raw form of
/// [`MySqlStore::complete_in`], without its `@@in_transaction` fence.
/// Returns whether it matched.
pub async fn complete_in(
    tx: &mut sqlx::MySqlConnection,
    store: &MySqlStore,
    key: &str,
    token: &[u8; 16],
    fingerprint: &[u8; 32],
    payload: &[u8],
    retention: Duration,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(&store.statements().swap)
        .bind(&token[..])
        .bind(&fingerprint[..])
        .bind(1_u8)
        .bind(payload)
        .bind(None::<i64>)
        .bind(micros(retention))
        .bind(key)
        .bind(&token[..])
        .execute(&mut *tx)
        .await?;
    Ok(done.rows_affected() == 1)
}
