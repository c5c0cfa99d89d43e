//! Pools shared with the application, concurrent migrations, and
//! connections cut under the store.

use std::str::FromStr;
use std::time::Duration;

use idem_core::store::StoreErrorKind;
use idem_core::{Error, Idempotent, When};
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use idem_postgres::sqlx::{self, Connection, PgConnection};
use idem_postgres::PostgresStore;
use idem_testing::sql_cases;

use crate::support::{self, Pg};

/// `connect` opens a working pool; a malformed URL is a config error and a
/// closed port a backend error.
#[tokio::test]
async fn connect_opens_a_pool_and_types_its_failures() {
    sql_cases::connect_opens_a_pool_and_types_its_failures::<Pg>().await;
}

/// The store holds a connection only for one statement, so work that uses
/// the same one-connection pool runs without deadlock.
#[tokio::test]
async fn a_pool_shared_with_the_application_works() {
    sql_cases::a_pool_shared_with_the_application_works::<Pg>().await;
}

/// Many processes migrating the same new table at once all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrations_of_one_table_all_succeed() {
    sql_cases::concurrent_migrations_of_one_table_all_succeed::<Pg>().await;
}

async fn store_named(app: &str) -> Option<(PostgresStore, idem_testing::Cleanup)> {
    let options = PgConnectOptions::from_str(&support::url())
        .unwrap()
        .application_name(app);
    support::pool(1).await?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    Some(support::store_in(pool).await)
}

async fn terminate(admin: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(app)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// A connection killed while a claim runs gives a typed backend error
/// (before the work ran); later calls on the same store succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_mid_statement_is_a_backend_error_and_the_pool_recovers() {
    let app = support::unique_name("idem_fault");
    let Some((store, _guard)) = store_named(&app).await else {
        return;
    };
    let admin = support::pool(1).await.unwrap();
    let idem = Idempotent::new(store.clone());
    let key = idem.key("k").unwrap();

    // An open transaction holding the key makes the claim wait, so it is
    // surely mid-statement when its backend is terminated.
    let mut other = PgConnection::connect(&support::url()).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {} VALUES ($1, '\\x00', '\\x00', 0, '', NULL, now() + interval '1 hour')",
        store.table()
    ))
    .bind(key.as_str())
    .execute(&mut *tx)
    .await
    .unwrap();
    let claim = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.execute("k", &(), || async { Ok::<u8, String>(1) })
                .await
        }
    });
    let mut waited = false;
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
             AND wait_event_type = 'Lock'",
        )
        .bind(&app)
        .fetch_one(&admin)
        .await
        .unwrap();
        if waiting > 0 {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waited, "the claim never blocked");
    assert!(terminate(&admin, &app).await >= 1);
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

    let ran: u8 = idem
        .execute("k", &(), || async { Ok::<_, String>(2) })
        .await
        .unwrap();
    assert_eq!(ran, 2);
}

/// Connections killed while idle, even while the work runs, are replaced
/// without an error reaching the caller.
#[tokio::test]
async fn connections_killed_while_idle_are_replaced() {
    let app = support::unique_name("idem_idle");
    let Some((store, _guard)) = store_named(&app).await else {
        return;
    };
    let admin = support::pool(1).await.unwrap();
    sql_cases::connections_killed_while_idle_are_replaced::<Pg, _, _>(store, move || {
        let (admin, app) = (admin.clone(), app.clone());
        async move {
            terminate(&admin, &app).await;
        }
    })
    .await;
}

/// Callers of `execute_in_tx` dropped at any moment — while the transaction
/// begins, while the work runs, while it commits — leave no pooled
/// connection inside a transaction: each one the pool hands out later runs
/// its statements on their own, committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_dropped_mid_transaction_leave_no_connection_inside_one() {
    let app = support::unique_name("idem_cancel");
    let Some((store, _table)) = store_named(&app).await else {
        return;
    };
    let Some(admin) = support::pool(1).await else {
        return;
    };
    let idem = Idempotent::new(store.clone());
    let mut stuck_after = Vec::new();
    for n in 0..300u64 {
        // From at once to 2 ms in, in steps of 50 µs.
        let cut = std::time::Duration::from_micros(n % 41 * 50);
        let key = format!("k{n}");
        let call = store.execute_in_tx(&idem, &key, &(), |tx| {
            Box::pin(async move { sqlx::query("SELECT 1").execute(&mut *tx).await.map(|_| 1u8) })
        });
        let _ = tokio::time::timeout(cut, call).await;
        // A connection goes back to the pool, and a dropped transaction
        // rolls back, in tasks of their own: on a busy machine that takes a
        // moment. A leaked transaction stays open until the next call
        // happens to reuse its connection, so each cut is looked at, for up
        // to a second, before the next call.
        let mut stuck = 0;
        for _ in 0..100 {
            stuck = sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
            )
            .bind(&app)
            .fetch_one(&admin)
            .await
            .unwrap();
            if stuck == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        if stuck > 0 {
            stuck_after.push(cut);
        }
    }
    let stuck = stuck_after.len();
    assert_eq!(
        stuck, 0,
        "connections left inside a transaction after cuts at {stuck_after:?}"
    );
}
