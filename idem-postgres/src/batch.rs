//! Claims of several keys in one statement, for a caller that commits them
//! together with writes of its own: a job queue in the same database that
//! claims a batch of jobs and their keys in one commit.

use idem_core::store::{PreparedClaim, State, StoreError};
use sqlx::postgres::PgConnection;
use sqlx::Row;

use crate::error::error;
use crate::schema::NOW;
use crate::{PostgresStore, BACKEND};

/// The batch claim for the quoted table `t`.
///
/// It takes one array per column (`unnest`), inserts each row under the
/// same rule as the single-key claim — only where the key is absent or its
/// record expired — and answers one row: the keys it inserted and the
/// database it ran in, so that a connection to another database is told
/// from keys held by others.
pub(crate) fn claim_statement(t: &str) -> String {
    let micros = |column: &str| format!("{NOW} + c.{column} * interval '1 microsecond'");
    let answer = "SELECT coalesce(array_agg(key), '{}') AS keys, \
                  current_database()::text AS database FROM done";
    // Keys are inserted in order, so concurrent batches take their row
    // locks in one order and cannot deadlock.
    format!(
        "WITH done AS (\
         INSERT INTO {t} AS r \
         (key, token, fingerprint, state, payload, lease_until, retain_until) \
         SELECT c.key, c.token, c.fingerprint, $4::int2, '\\x'::bytea, {}, {} \
         FROM unnest($1::text[], $2::bytea[], $3::bytea[], $5::int8[], $6::int8[]) \
         AS c(key, token, fingerprint, lease_us, retain_us) \
         ORDER BY c.key \
         ON CONFLICT (key) DO UPDATE SET token = excluded.token, \
         fingerprint = excluded.fingerprint, state = excluded.state, \
         payload = excluded.payload, lease_until = excluded.lease_until, \
         retain_until = excluded.retain_until \
         WHERE r.retain_until <= {NOW} \
         RETURNING r.key) {answer}",
        micros("lease_us"),
        micros("retain_us"),
    )
}

impl PostgresStore {
    /// Inserts each prepared claim on `conn` in one statement, as
    /// [`Store::insert`](idem_core::store::Store::insert) would one by one, and
    /// returns, in order, whether each was inserted: then, once `conn`'s
    /// transaction has committed, [`PreparedClaim::inserted`] gives its
    /// lease. A claim not inserted found a live record (or repeats a key
    /// earlier in the batch): call [`Idempotent::begin`] or `execute` for
    /// it, which decides what the record means.
    ///
    /// `conn` may be in a transaction with writes of the caller's (a job
    /// queue claiming the jobs these keys belong to, so that both commit
    /// together) or not (the claims commit at once). It must be on the
    /// store's database; one on another database is a
    /// [config](idem_core::store::StoreErrorKind::Config) error, and its
    /// transaction must be rolled back. A backend error leaves it unknown
    /// which claims landed, as for `insert`; in a transaction, roll back.
    ///
    /// [`Idempotent::begin`]: idem_core::Idempotent::begin
    pub async fn claim_many_in(
        &self,
        conn: &mut PgConnection,
        claims: &[PreparedClaim],
    ) -> Result<Vec<bool>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        // A key twice in one statement would fail it as a whole; the
        // repeats go through `begin` instead.
        let mut seen = std::collections::HashSet::with_capacity(claims.len());
        let first: Vec<bool> = claims.iter().map(|c| seen.insert(c.key())).collect();
        let records: Vec<_> = claims
            .iter()
            .zip(&first)
            .filter(|(_, first)| **first)
            .map(|(claim, _)| (claim.key().as_str(), claim.record()))
            .collect();
        let keys: Vec<&str> = records.iter().map(|(key, _)| *key).collect();
        let tokens: Vec<&[u8]> = records
            .iter()
            .map(|(_, r)| &r.token.as_bytes()[..])
            .collect();
        let fingerprints: Vec<&[u8]> = records
            .iter()
            .map(|(_, r)| r.fingerprint.stored())
            .collect();
        let leases: Vec<i64> = records
            .iter()
            .map(|(_, r)| idem_sql::micros(r.lease.unwrap_or_default()))
            .collect();
        let retentions: Vec<i64> = records
            .iter()
            .map(|(_, r)| idem_sql::micros(r.retention))
            .collect();
        let row = sqlx::query(&self.statements().claim_many)
            .bind(&keys)
            .bind(&tokens)
            .bind(&fingerprints)
            .bind(i16::from(State::InFlight.as_u8()))
            .bind(&leases)
            .bind(&retentions)
            .fetch_one(&mut *conn)
            .await
            .map_err(error)?;
        let changed = self.changed_keys(&row)?;
        Ok(claims
            .iter()
            .zip(first)
            .map(|(claim, first)| first && changed.contains(claim.key().as_str()))
            .collect())
    }

    /// The keys the batch claim inserted, after checking that it ran on
    /// the store's database.
    fn changed_keys(
        &self,
        row: &sqlx::postgres::PgRow,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let database: String = row.try_get("database").map_err(error)?;
        if let Some(ours) = self.pool().connect_options().get_database() {
            if ours != database {
                return Err(StoreError::config(
                    BACKEND,
                    format!(
                        "the connection is on database {database:?} but the store's is \
                         {ours:?}; roll its transaction back"
                    ),
                ));
            }
        }
        let keys: Vec<String> = row.try_get("keys").map_err(error)?;
        Ok(keys.into_iter().collect())
    }
}
