//! Round trips counted by the server itself: transactions committed in a
//! database that only the store under test uses. Every statement the store
//! runs is its own transaction, so the count is the statement count.

use std::str::FromStr;

use idem_core::{Error, Idempotent};
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use idem_postgres::{sqlx, PostgresStore};

use crate::support;

struct Counter {
    store_pool: PgPool,
    observer: PgPool,
    database: String,
}

impl Counter {
    /// Transactions committed in the dedicated database so far. Statistics
    /// reach shared memory asynchronously, so the store's own connection
    /// (the pool has one) is told to flush them first: that flush is one
    /// more transaction, which [`Counter::during`] subtracts. It reads a
    /// table because a backend with no table statistics pending skips the
    /// flush, its own commit included, and the count would lag by one.
    async fn commits(&self) -> i64 {
        sqlx::query("SELECT pg_stat_force_next_flush(), count(*) FROM probe")
            .execute(&self.store_pool)
            .await
            .unwrap();
        sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
            .bind(&self.database)
            .fetch_one(&self.observer)
            .await
            .unwrap()
    }

    async fn during<F: std::future::Future<Output = ()>>(&self, run: F) -> i64 {
        let before = self.commits().await;
        run.await;
        self.commits().await - before - 1
    }
}

/// First execution 2 statements, replay 1, in progress 1, mismatch 1.
#[tokio::test]
async fn each_outcome_costs_the_designed_number_of_statements() {
    let Some(observer) = support::pool(1).await else {
        return;
    };
    let database = support::unique_name("idem_rt");
    sqlx::raw_sql(&format!("CREATE DATABASE {database}"))
        .execute(&observer)
        .await
        .unwrap();
    let _guard = support::drop_database(&database);
    let options = PgConnectOptions::from_str(&support::url())
        .unwrap()
        .database(&database);
    let store_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let store = PostgresStore::from_pool(store_pool.clone());
    store.migrate().await.unwrap();
    sqlx::raw_sql("CREATE TABLE probe ()")
        .execute(&store_pool)
        .await
        .unwrap();
    let counter = Counter {
        store_pool,
        observer,
        database,
    };
    let idem = Idempotent::new(store);
    let run = |key: String, body: u32| {
        let idem = idem.clone();
        async move {
            idem.execute(&key, &body, || async { Ok::<_, String>(body) })
                .await
        }
    };

    // Warm every prepared statement into the connection's cache: the first
    // use of a statement on a connection costs a Parse round trip.
    counter.commits().await;
    run("warm".into(), 1).await.unwrap();
    run("warm".into(), 1).await.unwrap();
    let held = idem
        .begin("held", idem_core::Fingerprint::of_json(&1).unwrap())
        .await
        .unwrap();

    const TIMES: i64 = 3;
    let first = counter
        .during(async {
            for i in 0..TIMES {
                assert_eq!(run(format!("k{i}"), 1).await.unwrap(), 1);
            }
        })
        .await;
    let replay = counter
        .during(async {
            for i in 0..TIMES {
                assert_eq!(run(format!("k{i}"), 1).await.unwrap(), 1);
            }
        })
        .await;
    let in_progress = counter
        .during(async {
            for _ in 0..TIMES {
                let busy = run("held".into(), 1).await;
                assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
            }
        })
        .await;
    let mismatch = counter
        .during(async {
            for i in 0..TIMES {
                let other = run(format!("k{i}"), 2).await;
                assert!(matches!(other, Err(Error::Mismatch)), "{other:?}");
            }
        })
        .await;
    drop(held);
    eprintln!(
        "statements per call: first {} replay {} in-progress {} mismatch {}",
        first as f64 / TIMES as f64,
        replay as f64 / TIMES as f64,
        in_progress as f64 / TIMES as f64,
        mismatch as f64 / TIMES as f64,
    );
    assert_eq!(
        [first, replay, in_progress, mismatch],
        [2 * TIMES, TIMES, TIMES, TIMES],
        "statements for first execution, replay, in progress, mismatch"
    );
}

/// Replays and in-progress answers read the record without writing a new
/// version of its row, so they cost no WAL and no commit flush.
#[tokio::test]
async fn replays_and_in_progress_answers_write_nothing() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let idem = Idempotent::new(store.clone());
    let version = |key: String| {
        let store = store.clone();
        async move {
            sqlx::query_scalar::<_, String>(&format!(
                "SELECT xmin::text || ctid::text FROM {} WHERE key = $1",
                store.table()
            ))
            .bind(key)
            .fetch_one(store.pool())
            .await
            .unwrap()
        }
    };
    let done = idem.key("done").unwrap().as_str().to_owned();
    let _: u8 = idem
        .execute("done", &(), || async { Ok::<_, String>(1) })
        .await
        .unwrap();
    let held = idem
        .begin("held", idem_core::Fingerprint::of_json(&()).unwrap())
        .await
        .unwrap();
    let busy = idem.key("held").unwrap().as_str().to_owned();
    let before = (version(done.clone()).await, version(busy.clone()).await);
    for _ in 0..3 {
        let _: u8 = idem
            .execute("done", &(), || async { Ok::<_, String>(2) })
            .await
            .unwrap();
        let answer = idem
            .execute("held", &(), || async { Ok::<u8, String>(3) })
            .await;
        assert!(
            matches!(answer, Err(Error::InProgress { .. })),
            "{answer:?}"
        );
    }
    assert_eq!((version(done).await, version(busy).await), before);
    drop(held);
}
