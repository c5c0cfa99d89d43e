//! Pools shared with the application, concurrent migrations, and
//! connections killed under the store (`KILL`) before and after the work.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::StoreErrorKind;
use idem_core::{Error, Fingerprint, Idempotent, When};
use idem_mysql::sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use idem_mysql::sqlx::{self, Connection, MySqlConnection};
use idem_mysql::MySqlStore;

use crate::{support, until_waiting};

/// `connect` opens a working pool; a malformed URL is a config error and a
/// closed port a backend error.
#[tokio::test]
async fn connect_opens_a_pool_and_types_its_failures() {
    let Some(_) = support::pool(1).await else {
        return;
    };
    let store = MySqlStore::connect(&support::url()).await.unwrap();
    let table = support::unique_name("idem_connect");
    let _guard = support::DropGuard::table(&table);
    let store = store.with_table(&table).unwrap();
    store.migrate().await.unwrap();
    let ran: u8 = Idempotent::new(store)
        .execute("k", &(), || async { Ok::<_, String>(3) })
        .await
        .unwrap();
    assert_eq!(ran, 3);

    let malformed = MySqlStore::connect("mysql://[::1").await.unwrap_err();
    assert_eq!(malformed.kind(), StoreErrorKind::Config, "{malformed}");
    let pool = MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("mysql://root@127.0.0.1:1/test")
        .unwrap();
    let closed = idem_core::store::Store::load(&MySqlStore::from_pool(pool), "k")
        .await
        .unwrap_err();
    assert_eq!(closed.kind(), StoreErrorKind::Backend, "{closed}");
}

/// The store holds a connection only for one statement, so work that uses
/// the same one-connection pool runs without deadlock.
#[tokio::test]
async fn a_pool_shared_with_the_application_works() {
    let Some(pool) = support::pool(1).await else {
        return;
    };
    let (store, _guard) = support::store_in(pool.clone()).await;
    let app_table = support::unique_name("idem_app");
    sqlx::raw_sql(&format!("CREATE TABLE {app_table} (id int)"))
        .execute(&pool)
        .await
        .unwrap();
    let _app_guard = support::DropGuard::table(&app_table);
    let idem = Idempotent::new(store);
    for _ in 0..3 {
        let pool = pool.clone();
        let insert = format!("INSERT INTO {app_table} VALUES (1)");
        let rows: u64 = idem
            .execute("order-1", &"body", || async move {
                let done = sqlx::query(&insert)
                    .execute(&pool)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(done.rows_affected())
            })
            .await
            .unwrap();
        assert_eq!(rows, 1);
    }
    let count: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {app_table}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 1, "the work ran once for three calls");
}

/// Many processes migrating the same new table at once all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_of_one_table_all_succeed() {
    let Some(pool) = support::pool(2).await else {
        return;
    };
    for round in 0..3 {
        let table = support::unique_name("idem_migrate");
        let _guard = support::DropGuard::table(&table);
        // Separate one-connection pools stand in for separate processes.
        let mut migrations = Vec::new();
        for _ in 0..12 {
            let own = MySqlPoolOptions::new()
                .max_connections(1)
                .connect(&support::url())
                .await
                .unwrap();
            let store = MySqlStore::from_pool(own).with_table(&table).unwrap();
            migrations.push(tokio::spawn(async move { store.migrate().await }));
        }
        for migration in migrations {
            migration
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&table)
            .unwrap();
        let ran: u8 = Idempotent::new(store)
            .execute("k", &(), || async { Ok::<_, String>(round) })
            .await
            .unwrap();
        assert_eq!(ran, round);
    }
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
    let idem = Idempotent::new(store);
    for round in 0..3_u8 {
        let ids = connection_ids(&pool, 2).await;
        let admin = admin.clone();
        let ran: u8 = idem
            .execute(&format!("k{round}"), &(), || async move {
                for id in ids {
                    kill(&admin, id).await;
                }
                Ok::<_, String>(round)
            })
            .await
            .unwrap();
        assert_eq!(ran, round);
        let replayed: u8 = idem
            .execute(&format!("k{round}"), &(), || async { Ok::<_, String>(99) })
            .await
            .unwrap();
        assert_eq!(replayed, round);
    }
}
