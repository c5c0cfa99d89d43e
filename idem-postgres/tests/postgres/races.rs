//! The claim statement under concurrency: one winner among racing claims,
//! and the rows a statement's snapshot cannot see.

use std::time::Duration;

use idem_core::store::{Insert, Store, Token};
use idem_postgres::sqlx::{self, Connection, PgConnection};
use idem_testing::races;

use crate::support;
use crate::{in_flight, MINUTE};

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

/// Waits until a claim statement on `table` is blocked on a lock.
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

const ROW: &str = "(key, token, fingerprint, state, payload, lease_until, retain_until) \
    VALUES ($1, $2, $3, 0, '', now() + interval '1 minute', now() + interval '1 minute')";

// Pins the snapshot race: a row committed by another transaction after the
// claim's snapshot was taken is invisible to its reads; the claim must
// still return it rather than nothing or an error.
/// A row inserted concurrently, committed after the claim began, is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_committed_after_the_claims_snapshot_is_found() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let mut other = PgConnection::connect(&support::url()).await.unwrap();
    let mut watcher = PgConnection::connect(&support::url()).await.unwrap();
    let theirs = Token::random();
    let mut tx = other.begin().await.unwrap();
    sqlx::query(&format!("INSERT INTO {} {ROW}", store.table()))
        .bind("k")
        .bind(&theirs.as_bytes()[..])
        .bind(&idem_core::Fingerprint::of_bytes(b"request").as_bytes()[..])
        .execute(&mut *tx)
        .await
        .unwrap();
    let claim = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .insert("k", &in_flight(Token::random(), MINUTE, MINUTE))
                .await
        }
    });
    until_claim_waits(&mut watcher, &store.table()).await;
    tx.commit().await.unwrap();
    match claim.await.unwrap().unwrap() {
        Insert::Found(record) => assert_eq!(record.token, theirs),
        other => panic!("expected the concurrent row, got {other:?}"),
    }
}

// Pins the second face of the snapshot race: the claim's snapshot holds an
// expired row, which a concurrent transaction replaces with a live one.
/// An expired row replaced concurrently by a live one is found, not replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_row_renewed_after_the_claims_snapshot_is_found() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let brief = Duration::from_millis(20);
    let old = Token::random();
    store
        .insert("k", &in_flight(old, brief, brief))
        .await
        .unwrap();
    tokio::time::sleep(brief * 2).await;
    for commit in [true, false] {
        let mut other = PgConnection::connect(&support::url()).await.unwrap();
        let mut watcher = PgConnection::connect(&support::url()).await.unwrap();
        let theirs = Token::random();
        let mut tx = other.begin().await.unwrap();
        sqlx::query(&format!(
            "UPDATE {} SET token = $2, lease_until = now() + interval '1 minute', \
             retain_until = now() + interval '1 minute' WHERE key = $1",
            store.table()
        ))
        .bind("k")
        .bind(&theirs.as_bytes()[..])
        .execute(&mut *tx)
        .await
        .unwrap();
        let mine = Token::random();
        let claim = tokio::spawn({
            let store = store.clone();
            async move { store.insert("k", &in_flight(mine, MINUTE, MINUTE)).await }
        });
        until_claim_waits(&mut watcher, &store.table()).await;
        if commit {
            tx.commit().await.unwrap();
            match claim.await.unwrap().unwrap() {
                Insert::Found(record) => assert_eq!(record.token, theirs),
                other => panic!("expected the renewed row, got {other:?}"),
            }
            // Expire it again for the rolled-back round.
            sqlx::query(&format!(
                "UPDATE {} SET retain_until = now() - interval '1 second'",
                store.table()
            ))
            .execute(&mut other)
            .await
            .unwrap();
        } else {
            tx.rollback().await.unwrap();
            assert_eq!(claim.await.unwrap().unwrap(), Insert::Inserted);
            assert_eq!(store.load("k").await.unwrap().unwrap().token, mine);
        }
    }
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
    let mut other = PgConnection::connect(&support::url()).await.unwrap();
    let mut watcher = PgConnection::connect(&support::url()).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query(&format!("INSERT INTO {} {ROW}", store.table()))
        .bind("k")
        .bind(&Token::random().as_bytes()[..])
        .bind(&idem_core::Fingerprint::of_bytes(b"request").as_bytes()[..])
        .execute(&mut *tx)
        .await
        .unwrap();
    let mine = Token::random();
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.insert("k", &in_flight(mine, MINUTE, MINUTE)).await }
    });
    until_claim_waits(&mut watcher, &store.table()).await;
    claim.abort();
    assert!(claim.await.unwrap_err().is_cancelled());
    tx.rollback().await.unwrap();
    let mut seen = None;
    for _ in 0..200 {
        seen = store.load("k").await.unwrap();
        if seen.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen.map(|record| record.token), Some(mine));
}

/// Concurrent purgers split the expired rows between them, deleting each
/// once, and leave live rows alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purgers_delete_each_expired_row_once() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    sqlx::query(&format!(
        "INSERT INTO {} SELECT 'old' || i, '\\x00', '\\x00', 1, '', NULL, \
         now() - interval '1 second' FROM generate_series(1, 400) AS i",
        store.table()
    ))
    .execute(store.pool())
    .await
    .unwrap();
    races::purgers_delete_each_expired_row_once(&store, 400).await;
}
