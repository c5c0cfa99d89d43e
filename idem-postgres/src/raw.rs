//! The raw minimal protocol, by hand: the claim statement and the
//! token-conditioned complete, with nothing of idem around them. Benchmarks
//! compare `execute` against it on the same pool; it is not an API.

use std::time::Duration;

use sqlx::Row;

use crate::row::interval;
use crate::PostgresStore;

/// What the bare claim statement returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The key was free and is now claimed with the caller's token.
    Inserted,
    /// A live record holds the key: its state code and payload.
    Found {
        /// 0 in flight, 1 completed, 2 failed.
        state: i16,
        /// The stored payload.
        payload: Vec<u8>,
    },
}

/// Runs the claim statement of `store` for `key` with an in-flight record.
pub async fn claim(
    store: &PostgresStore,
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
        .bind(0_i16)
        .bind(&[] as &[u8])
        .bind(interval(lease))
        .bind(interval(retention))
        .fetch_one(store.pool())
        .await?;
    if row.try_get(0)? {
        Ok(Claimed::Inserted)
    } else {
        Ok(Claimed::Found {
            state: row.try_get(3)?,
            payload: row.try_get(4)?,
        })
    }
}

/// Runs the complete statement of `store`: records `payload` as completed
/// if `token` still owns `key`. Returns whether it did.
pub async fn complete(
    store: &PostgresStore,
    key: &str,
    token: &[u8; 16],
    fingerprint: &[u8; 32],
    payload: &[u8],
    retention: Duration,
) -> Result<bool, sqlx::Error> {
    let done = completion(store, key, token, fingerprint, payload, retention)
        .execute(store.pool())
        .await?;
    Ok(done.rows_affected() == 1)
}

fn completion<'q>(
    store: &'q PostgresStore,
    key: &'q str,
    token: &'q [u8; 16],
    fingerprint: &'q [u8; 32],
    payload: &'q [u8],
    retention: Duration,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(&store.statements().swap)
        .bind(key)
        .bind(&token[..])
        .bind(&token[..])
        .bind(&fingerprint[..])
        .bind(1_i16)
        .bind(payload)
        .bind(None::<sqlx::postgres::types::PgInterval>)
        .bind(interval(retention))
}

/// The token-conditioned completion of `store` on `conn`, which the caller
/// holds inside its own transaction: the raw form of
/// [`PostgresStore::complete_in`]. Returns whether it matched.
pub async fn complete_in(
    conn: &mut sqlx::PgConnection,
    store: &PostgresStore,
    key: &str,
    token: &[u8; 16],
    fingerprint: &[u8; 32],
    payload: &[u8],
    retention: Duration,
) -> Result<bool, sqlx::Error> {
    let done = completion(store, key, token, fingerprint, payload, retention)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}
