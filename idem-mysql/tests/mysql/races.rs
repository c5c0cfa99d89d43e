//! The claim statement under concurrency: one winner among racing claims,
//! claims queued behind another transaction's row, and keys fought over by
//! claims, releases and completions at once without a deadlock reaching
//! any caller.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_core::store::{Insert, Store, Token};
use idem_core::{Error, Fingerprint, Idempotent};
use idem_mysql::sqlx::{self, Connection, MySqlConnection};
use idem_mysql::MySqlStore;
use idem_testing::races;
use idem_testing::sql_races::{self, hex, SqlRaces};
use tokio::sync::Barrier;

use crate::support::{self, My};
use crate::{in_flight, until_waiting, MINUTE};

async fn store_with(connections: u32) -> Option<(MySqlStore, idem_testing::Cleanup)> {
    Some(support::store_in(support::pool(connections).await?).await)
}

/// Racing claims of an absent key: exactly one inserts, all others see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_of_an_absent_key_have_one_winner() {
    let Some((store, _guard)) = store_with(24).await else {
        return;
    };
    races::racing_claims_have_one_winner(&store, 24, false).await;
}

/// Racing claims of an expired key: exactly one replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_of_an_expired_key_have_one_winner() {
    let Some((store, _guard)) = store_with(24).await else {
        return;
    };
    races::racing_claims_have_one_winner(&store, 24, true).await;
}

impl SqlRaces for My {
    fn insert_live(table: &str, key: &str, token: &Token, fingerprint: &Fingerprint) -> String {
        format!(
            "INSERT INTO {table} (`key`, token, fingerprint, state, payload, lease_until, \
             retain_until) VALUES ('{key}', X'{}', X'{}', 0, '', \
             UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE)",
            hex(token.as_bytes()),
            hex(fingerprint.as_bytes()),
        )
    }

    fn renew(table: &str, key: &str, token: &Token) -> String {
        format!(
            "UPDATE {table} SET token = X'{}', lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, \
             retain_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE `key` = '{key}'",
            hex(token.as_bytes()),
        )
    }

    fn expire(table: &str) -> String {
        format!("UPDATE {table} SET retain_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND")
    }

    fn insert_expired(table: &str, rows: usize) -> String {
        format!(
            "INSERT INTO {table} SELECT CONCAT('old', seq), X'00', X'00', 1, '', NULL, \
             UTC_TIMESTAMP(6) - INTERVAL 1 SECOND FROM seq_1_to_{rows}"
        )
    }

    async fn execute(conn: &mut MySqlConnection, sql: String) {
        sqlx::query(&sql).execute(&mut *conn).await.unwrap();
    }

    async fn until_claim_waits(conn: &mut MySqlConnection, table: &str) {
        until_waiting(conn, table).await;
    }
}

// Pins the lock queue: a claim that meets a row another transaction has
// inserted but not committed waits for it, then returns it if it was
// committed or inserts its own if it was rolled back; never an error.
/// A claim queued behind an uncommitted insert gets the outcome of that
/// transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_queued_behind_an_uncommitted_insert_sees_its_outcome() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    for commit in [true, false] {
        let key = format!("k-{commit}");
        sql_races::a_claim_behind_an_uncommitted_insert_gets_its_outcome::<My>(
            &store, &key, commit,
        )
        .await;
    }
}

// Pins the second face of the queue: the claim meets an expired row that a
// concurrent transaction is renewing. It must judge the row as committed
// when it gets the lock, not as it was when the statement began.
/// An expired row renewed by a transaction the claim waits for is found,
/// not replaced; rolled back, it is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_row_renewed_while_the_claim_waits_is_found() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    sql_races::a_claim_behind_a_renewal_of_an_expired_row_gets_its_outcome::<My>(&store).await;
}

/// Many callers fighting over a few keys — claiming, releasing after a
/// failed attempt, completing — never see a deadlock or any store error,
/// and each key's work completes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_releases_and_completions_on_shared_keys_never_fail() {
    let Some((store, _guard)) = store_with(32).await else {
        return;
    };
    let rounds: usize = std::env::var("IDEM_MYSQL_STRESS_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    const KEYS: usize = 4;
    const CALLERS: usize = 32;
    for round in 0..rounds {
        let idem = Idempotent::new(store.clone());
        let completed: Arc<Vec<AtomicUsize>> =
            Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
        let barrier = Arc::new(Barrier::new(CALLERS));
        let tasks: Vec<_> = (0..CALLERS)
            .map(|caller| {
                let (idem, completed, barrier) =
                    (idem.clone(), Arc::clone(&completed), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut store_errors = Vec::new();
                    for attempt in 0..40 {
                        let slot = (caller + attempt) % KEYS;
                        let key = format!("r{round}-k{slot}");
                        // Every other attempt fails, so its key is released
                        // (a DELETE) while other callers queue on it.
                        let fail = (caller * 7 + attempt * 3) % 5 < 2;
                        let completed = Arc::clone(&completed);
                        let outcome = idem
                            .execute(&key, &slot, || async move {
                                if fail {
                                    Err("try again".to_owned())
                                } else {
                                    completed[slot].fetch_add(1, Ordering::SeqCst);
                                    Ok(slot)
                                }
                            })
                            .await;
                        match outcome {
                            Ok(done) => assert_eq!(done, slot),
                            Err(Error::Work(_) | Error::InProgress { .. }) => {}
                            Err(Error::Store { source, .. }) => store_errors.push(source),
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    store_errors
                })
            })
            .collect();
        let mut store_errors = Vec::new();
        for task in tasks {
            store_errors.extend(task.await.unwrap());
        }
        assert!(store_errors.is_empty(), "round {round}: {store_errors:?}");
        for (slot, count) in completed.iter().enumerate() {
            assert_eq!(
                count.load(Ordering::SeqCst),
                1,
                "round {round}: key {slot} completed {count:?} times"
            );
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
    sql_races::a_claim_dropped_mid_statement_still_takes_effect::<My>(&store).await;
}

/// Concurrent purgers split the expired rows between them, deleting each
/// once, and leave live rows alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purgers_delete_each_expired_row_once() {
    let Some((store, _guard)) = store_with(8).await else {
        return;
    };
    sql_races::concurrent_purgers_delete_each_expired_row_once::<My>(&store).await;
}

/// A purge larger than one delete statement still deletes exactly `limit`
/// rows per call.
#[tokio::test]
async fn a_purge_larger_than_one_statement_deletes_up_to_its_limit() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    sql_races::insert_expired::<My>(&store, 1200).await;
    assert_eq!(store.purge_expired(1100).await.unwrap(), 1100);
    assert_eq!(store.purge_expired(1100).await.unwrap(), 100);
    assert_eq!(store.purge_expired(1100).await.unwrap(), 0);
}

/// The server's count of deadlocks since it started.
async fn deadlocks(conn: &mut MySqlConnection) -> i64 {
    let (_, value): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    value.parse().unwrap()
}

// Pins the rerun of deadlock victims: a claim that InnoDB rolls back to
// break a deadlock took no effect, so the store runs it again instead of
// failing the caller.
/// A claim picked as a deadlock victim is run again and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_picked_as_a_deadlock_victim_is_run_again() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let table = store.table();
    let mut watcher = MySqlConnection::connect(&support::url()).await.unwrap();
    let before = deadlocks(&mut watcher).await;
    let mut other = MySqlConnection::connect(&support::url()).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    // Many rows written make this transaction the heavier one, so InnoDB
    // rolls back the claim rather than it.
    sqlx::query(&format!(
        "INSERT INTO {table} SELECT CONCAT('heavy', seq), X'00', X'00', 1, '', NULL, \
         UTC_TIMESTAMP(6) + INTERVAL 1 HOUR FROM seq_1_to_200"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    // Every gap of the retention index is locked, so the claim, having
    // inserted its primary-key record, waits to add its index entry.
    sqlx::query(&format!(
        "SELECT `key` FROM {table} FORCE INDEX (retain_until_idx) \
         WHERE retain_until >= '2000-01-01' FOR UPDATE"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let mine = Token::random();
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.insert("k", &in_flight(mine, MINUTE, MINUTE)).await }
    });
    until_waiting(&mut watcher, &table).await;
    // Now this transaction waits for the claim's record: a cycle.
    sqlx::query(&format!(
        "SELECT 1 FROM {table} WHERE `key` = 'k' FOR UPDATE"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(claim.await.unwrap().unwrap(), Insert::Inserted);
    assert_eq!(store.load("k").await.unwrap().unwrap().token, mine);
    assert!(
        deadlocks(&mut watcher).await > before,
        "no deadlock happened"
    );
}
