//! Pools shared with the application, concurrent migrations, and
//! connections killed under the store (`KILL`) before and after the work:
//! a claim waiting on a row lock (the error says the work never ran, and
//! the next call runs it once), a completion waiting on a row lock (the
//! error says the work ran, and the key stays claimed by its owner), and
//! every idle pool connection while the work runs (replaced, no error).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_core::store::StoreErrorKind;
use idem_core::{Error, Fingerprint, Idempotent, When};
use idem_mysql::sqlx::mysql::MySqlPool;
use idem_mysql::sqlx::{self, Connection, MySqlConnection};
use idem_testing::sql_cases;

use crate::support::{self, My};
use crate::until_waiting;

/// `connect` opens a working pool; a malformed URL is a config error and a
/// closed port a backend error.
#[tokio::test]
async fn connect_opens_a_pool_and_types_its_failures() {
    sql_cases::connect_opens_a_pool_and_types_its_failures::<My>().await;
}

/// The store holds a connection only for one statement, so work that uses
/// the same one-connection pool runs without deadlock.
#[tokio::test]
async fn a_pool_shared_with_the_application_works() {
    sql_cases::a_pool_shared_with_the_application_works::<My>().await;
}

/// Many processes migrating the same new table at once all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_of_one_table_all_succeed() {
    sql_cases::concurrent_migrations_of_one_table_all_succeed::<My>().await;
}

async fn kill(admin: &MySqlPool, connection: u64) {
    sqlx::raw_sql(&format!("KILL CONNECTION {connection}"))
        .execute(admin)
        .await
        .unwrap();
}

/// A connection killed while a claim waits on a lock gives a typed backend
/// error (before the work ran, which never runs); later calls on the same
/// store succeed and run the work once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_mid_claim_is_a_backend_error_and_the_pool_recovers() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let admin = support::pool(1).await.unwrap();
    let mut watcher = MySqlConnection::connect(&support::url()).await.unwrap();
    let idem = Idempotent::new(store.clone());
    let key = idem.key("k").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |value: u8| {
        let runs = Arc::clone(&runs);
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u8, String>(value)
        }
    };

    // An open transaction holding the key makes the claim wait, so it is
    // surely mid-statement when its connection is killed.
    let mut other = MySqlConnection::connect(&support::url()).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {} VALUES (?, X'00', X'00', 0, '', NULL, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
        store.table()
    ))
    .bind(key.as_str())
    .execute(&mut *tx)
    .await
    .unwrap();
    let claim = tokio::spawn({
        let (idem, work) = (idem.clone(), work(1));
        async move { idem.execute("k", &(), work).await }
    });
    let victim = until_waiting(&mut watcher, &store.table()).await;
    kill(&admin, victim).await;
    match claim.await.unwrap() {
        Err(Error::Store { source, when }) => {
            assert_eq!(
                (source.kind(), when),
                (StoreErrorKind::Backend, When::BeforeWork)
            );
            eprintln!("{source}: {:?}", std::error::Error::source(&source));
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    tx.rollback().await.unwrap();

    assert_eq!(idem.execute("k", &(), work(2)).await.unwrap(), 2);
    assert_eq!(idem.execute("k", &(), work(3)).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A connection killed while the completion waits on a lock gives a
/// backend error after the work ran; the record is not lost: the key stays
/// claimed by that owner, so no caller runs the work again while its lease
/// is live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_mid_completion_keeps_the_key_claimed() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let admin = support::pool(1).await.unwrap();
    let mut watcher = MySqlConnection::connect(&support::url()).await.unwrap();
    let idem = Idempotent::new(store.clone());
    let key = idem.key("k").unwrap().as_str().to_owned();
    let runs = Arc::new(AtomicUsize::new(0));

    // Another session locks the claimed row while the work runs, so the
    // completion that follows the work has to wait for it.
    let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (locked, locked_rx) = tokio::sync::oneshot::channel::<()>();
    let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
    let locker = tokio::spawn({
        let sql = format!("SELECT 1 FROM {} WHERE `key` = ? FOR UPDATE", store.table());
        let key = key.clone();
        async move {
            let mut other = MySqlConnection::connect(&support::url()).await.unwrap();
            go_rx.await.unwrap();
            let mut tx = other.begin().await.unwrap();
            sqlx::query(&sql).bind(key).execute(&mut *tx).await.unwrap();
            locked.send(()).unwrap();
            release_rx.await.unwrap();
            tx.rollback().await.unwrap();
        }
    });
    let run = tokio::spawn({
        let (idem, runs) = (idem.clone(), Arc::clone(&runs));
        async move {
            idem.execute("k", &(), || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                go.send(()).unwrap();
                locked_rx.await.unwrap();
                Ok::<u8, String>(1)
            })
            .await
        }
    });
    let victim = until_waiting(&mut watcher, &store.table()).await;
    kill(&admin, victim).await;
    match run.await.unwrap() {
        Err(Error::Store { source, when }) => {
            assert_eq!(
                (source.kind(), when),
                (StoreErrorKind::Backend, When::AfterWork)
            );
        }
        other => panic!("expected a backend error after the work, got {other:?}"),
    }
    release.send(()).unwrap();
    locker.await.unwrap();
    let again = idem
        .execute("k", &(), || async { Ok::<u8, String>(2) })
        .await;
    assert!(matches!(again, Err(Error::InProgress { .. })), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let held = idem_core::store::Store::load(&store, &key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.fingerprint, Fingerprint::of_json(&()).unwrap());
}

/// The server's ids of every connection `pool` holds (at most `size`).
async fn connection_ids(pool: &MySqlPool, size: usize) -> Vec<u64> {
    let mut held = Vec::new();
    for _ in 0..size {
        held.push(pool.acquire().await.unwrap());
    }
    let mut ids = Vec::new();
    for conn in &mut held {
        ids.push(
            sqlx::query_scalar("SELECT CONNECTION_ID()")
                .fetch_one(&mut **conn)
                .await
                .unwrap(),
        );
    }
    ids
}

/// Connections killed while idle, even while the work runs, are replaced
/// without an error reaching the caller.
#[tokio::test]
async fn connections_killed_while_idle_are_replaced() {
    let Some(pool) = support::pool(2).await else {
        return;
    };
    let (store, _guard) = support::store_in(pool.clone()).await;
    let admin = support::pool(1).await.unwrap();
    sql_cases::connections_killed_while_idle_are_replaced::<My, _, _>(store, move || {
        let (admin, pool) = (admin.clone(), pool.clone());
        async move {
            for id in connection_ids(&pool, 2).await {
                kill(&admin, id).await;
            }
        }
    })
    .await;
}
