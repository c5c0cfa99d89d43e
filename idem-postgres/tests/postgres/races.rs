//! The claim statement under concurrency: one winner among racing claims,
//! and the rows a statement's snapshot cannot see.

use std::time::Duration;

use idem_core::store::Token;
use idem_core::Fingerprint;
use idem_postgres::sqlx::{self, PgConnection};
use idem_testing::races;
use idem_testing::sql_races::{self, hex, SqlRaces};

use crate::support::{self, Pg};

/// Racing claims of an absent key: exactly one inserts, all others see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_of_an_absent_key_have_one_winner() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    races::racing_claims_have_one_winner(&store, 24, false).await;
}

/// Racing claims of an expired key: exactly one replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_of_an_expired_key_have_one_winner() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    races::racing_claims_have_one_winner(&store, 24, true).await;
}

impl SqlRaces for Pg {
    fn insert_live(table: &str, key: &str, token: &Token, fingerprint: &Fingerprint) -> String {
        format!(
            "INSERT INTO {table} (key, token, fingerprint, state, payload, lease_until, \
             retain_until) VALUES ('{key}', '\\x{}', '\\x{}', 0, '', \
             now() + interval '1 minute', now() + interval '1 minute')",
            hex(token.as_bytes()),
            hex(fingerprint.as_bytes()),
        )
    }

    fn renew(table: &str, key: &str, token: &Token) -> String {
        format!(
            "UPDATE {table} SET token = '\\x{}', lease_until = now() + interval '1 minute', \
             retain_until = now() + interval '1 minute' WHERE key = '{key}'",
            hex(token.as_bytes()),
        )
    }

    fn expire(table: &str) -> String {
        format!("UPDATE {table} SET retain_until = now() - interval '1 second'")
    }

    fn insert_expired(table: &str, rows: usize) -> String {
        format!(
            "INSERT INTO {table} SELECT 'old' || i, '\\x00', '\\x00', 1, '', NULL, \
             now() - interval '1 second' FROM generate_series(1, {rows}) AS i"
        )
    }

    async fn execute(conn: &mut PgConnection, sql: String) {
        sqlx::query(&sql).execute(&mut *conn).await.unwrap();
    }

    async fn until_claim_waits(conn: &mut PgConnection, table: &str) {
        for _ in 0..500 {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE 'WITH seen AS%' AND position($1 in query) > 0",
            )
            .bind(table)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            if waiting > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the claim never waited on the concurrent transaction");
    }
}

// Pins the snapshot race: a row committed by another transaction after the
// claim's snapshot was taken is invisible to its reads; the claim must
// still return it rather than nothing or an error.
/// A row inserted concurrently, committed after the claim began, is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_after_the_claims_snapshot_is_found() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    sql_races::a_claim_behind_an_uncommitted_insert_gets_its_outcome::<Pg>(&store, "k", true).await;
}

// Pins the second face of the snapshot race: the claim's snapshot holds an
// expired row, which a concurrent transaction replaces with a live one.
/// An expired row replaced concurrently by a live one is found, not replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_row_renewed_after_the_claims_snapshot_is_found() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    sql_races::a_claim_behind_a_renewal_of_an_expired_row_gets_its_outcome::<Pg>(&store).await;
}

// Pins what a dropped call means on a networked store: the statement is
// already on the server, so dropping the future does not undo it. Callers
// (and checkers of histories) must treat a dropped call as in doubt.
/// A claim whose future is dropped mid-statement may still take effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_dropped_mid_statement_still_takes_effect() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    sql_races::a_claim_dropped_mid_statement_still_takes_effect::<Pg>(&store).await;
}

/// Concurrent purgers split the expired rows between them, deleting each
/// once, and leave live rows alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purgers_delete_each_expired_row_once() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    sql_races::concurrent_purgers_delete_each_expired_row_once::<Pg>(&store).await;
}
