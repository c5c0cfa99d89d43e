//! Races of the claim statement with a transaction another connection
//! holds open on the store's table, as every SQL store's own tests run
//! them: the claim waits for it, then gets its outcome; a claim dropped
//! while it waits still lands; purgers share the expired rows. The
//! PostgreSQL and MariaDB suites implement [`SqlRaces`] (the statements
//! that write such rows, and how to see a claim wait on a lock) for their
//! [`SqlStore`] marker and call these; what the claim must do is the same
//! on both, though why it waits (a snapshot, a lock queue) differs, and
//! each suite says which in its tests' comments.

use std::future::Future;
use std::time::Duration;

use idem_core::store::{Insert, Store, Token};
use idem_core::Fingerprint;
use sqlx::{Connection, Database};

use crate::races::{in_flight, MINUTE};
use crate::sql_cases::SqlStore;

/// The connection of the [`SqlStore`] `S`'s database.
pub type Conn<S> = <<S as SqlStore>::Db as Database>::Connection;

/// The statements of a SQL store's race tests, written in its dialect.
/// Rows are the store's (`key`, `token`, `fingerprint`, `state`, `payload`,
/// `lease_until`, `retain_until`); bytes go in as literals, by [`hex`].
pub trait SqlRaces: SqlStore {
    /// Inserts into `table` a live in-flight row of `key`, `token` and
    /// `fingerprint`, leased and retained for a minute.
    fn insert_live(table: &str, key: &str, token: &Token, fingerprint: &Fingerprint) -> String;

    /// Gives the row `key` of `table` the token `token`, leased and
    /// retained for a minute.
    fn renew(table: &str, key: &str, token: &Token) -> String;

    /// Ends the retention of every row of `table`.
    fn expire(table: &str) -> String;

    /// Inserts into `table` the completed rows `old1` … `old{rows}`, all
    /// past their retention.
    fn insert_expired(table: &str, rows: usize) -> String;

    /// Runs `sql` on `conn`.
    fn execute(conn: &mut Conn<Self>, sql: String) -> impl Future<Output = ()> + Send;

    /// Waits until a claim statement on `table` is blocked on a lock,
    /// polling through `conn`; panics if none ever is.
    fn until_claim_waits(conn: &mut Conn<Self>, table: &str) -> impl Future<Output = ()> + Send;
}

/// `bytes` in hexadecimal, for a store's byte literals.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A connection of its own to the server under test.
async fn connect<S: SqlRaces>() -> Conn<S> {
    Conn::<S>::connect(&S::url()).await.unwrap()
}

/// A claim of `key` on `store` that waits behind another connection's
/// uncommitted insert of it gets that transaction's outcome: its row when
/// `commit`, else its own insert; never an error.
pub async fn a_claim_behind_an_uncommitted_insert_gets_its_outcome<S: SqlRaces>(
    store: &S::Store,
    key: &str,
    commit: bool,
) {
    let table = S::table(store);
    let (mut other, mut watcher) = (connect::<S>().await, connect::<S>().await);
    let theirs = Token::random();
    let mut tx = other.begin().await.unwrap();
    let fingerprint = Fingerprint::of_bytes(b"request");
    S::execute(&mut tx, S::insert_live(&table, key, &theirs, &fingerprint)).await;
    let mine = Token::random();
    let claim = tokio::spawn({
        let (store, key) = (store.clone(), key.to_owned());
        async move { store.insert(&key, &in_flight(mine, MINUTE, MINUTE)).await }
    });
    S::until_claim_waits(&mut watcher, &table).await;
    if commit {
        tx.commit().await.unwrap();
        match claim.await.unwrap().unwrap() {
            Insert::Found(record) => assert_eq!(record.token, theirs),
            other => panic!("expected the concurrent row, got {other:?}"),
        }
    } else {
        tx.rollback().await.unwrap();
        assert_eq!(claim.await.unwrap().unwrap(), Insert::Inserted);
        assert_eq!(store.load(key).await.unwrap().unwrap().token, mine);
    }
}

/// A claim of an expired row that waits behind another connection renewing
/// it finds the renewed row if that commits, and replaces the row if it
/// rolls back: the claim judges the row as it is once it gets it, not as
/// it was when its statement began.
pub async fn a_claim_behind_a_renewal_of_an_expired_row_gets_its_outcome<S: SqlRaces>(
    store: &S::Store,
) {
    let table = S::table(store);
    let brief = Duration::from_millis(20);
    store
        .insert("k", &in_flight(Token::random(), brief, brief))
        .await
        .unwrap();
    let mut watcher = connect::<S>().await;
    for commit in [true, false] {
        tokio::time::sleep(brief * 2).await;
        let mut other = connect::<S>().await;
        let theirs = Token::random();
        let mut tx = other.begin().await.unwrap();
        S::execute(&mut tx, S::renew(&table, "k", &theirs)).await;
        let mine = Token::random();
        let claim = tokio::spawn({
            let store = store.clone();
            async move { store.insert("k", &in_flight(mine, MINUTE, MINUTE)).await }
        });
        S::until_claim_waits(&mut watcher, &table).await;
        if commit {
            tx.commit().await.unwrap();
            match claim.await.unwrap().unwrap() {
                Insert::Found(record) => assert_eq!(record.token, theirs),
                other => panic!("expected the renewed row, got {other:?}"),
            }
            // Expire it again for the rolled-back round.
            S::execute(&mut other, S::expire(&table)).await;
        } else {
            tx.rollback().await.unwrap();
            assert_eq!(claim.await.unwrap().unwrap(), Insert::Inserted);
            assert_eq!(store.load("k").await.unwrap().unwrap().token, mine);
        }
    }
}

/// A claim whose future is dropped while its statement waits on the
/// server still takes effect once the lock is free: dropping the future
/// does not undo what the server already has.
pub async fn a_claim_dropped_mid_statement_still_takes_effect<S: SqlRaces>(store: &S::Store) {
    let table = S::table(store);
    let (mut other, mut watcher) = (connect::<S>().await, connect::<S>().await);
    let mut tx = other.begin().await.unwrap();
    let fingerprint = Fingerprint::of_bytes(b"request");
    S::execute(
        &mut tx,
        S::insert_live(&table, "k", &Token::random(), &fingerprint),
    )
    .await;
    let mine = Token::random();
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.insert("k", &in_flight(mine, MINUTE, MINUTE)).await }
    });
    S::until_claim_waits(&mut watcher, &table).await;
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

/// Fills `store`'s table with `rows` expired rows, by
/// [`SqlRaces::insert_expired`].
pub async fn insert_expired<S: SqlRaces>(store: &S::Store, rows: usize) {
    let sql = S::insert_expired(&S::table(store), rows);
    S::execute(&mut connect::<S>().await, sql).await;
}

/// Four purgers over 400 expired rows delete each once and leave a live
/// row alone, as [`crate::races::purgers_delete_each_expired_row_once`].
pub async fn concurrent_purgers_delete_each_expired_row_once<S: SqlRaces>(store: &S::Store) {
    insert_expired::<S>(store, 400).await;
    crate::races::purgers_delete_each_expired_row_once(store, 400).await;
}
