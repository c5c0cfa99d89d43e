//! The whole conformance kit against the real MariaDB at `IDEM_MYSQL_URL`,
//! each case on a fresh table of its own that is dropped when the case
//! ends.

mod support;

use idem_conformance::Fixture;

/// A store on a new, migrated table, with a small pool of its own: every
/// case runs on its own tokio runtime, and a sqlx connection cannot outlive
/// the runtime that opened it, so pools are not shared between cases.
///
/// The kit's cases cannot skip one by one, so an unreachable server skips
/// the whole binary with the reason printed (and fails it under `CI`).
async fn factory() -> Fixture {
    idem_testing::Server::MySql.require_for_binary();
    let Some(pool) = support::pool(8).await else {
        panic!("MariaDB answers but refuses a pool; see the message above");
    };
    let (store, guard) = support::store_in(pool).await;
    let (pool, table) = (store.pool().clone(), store.table());
    // Straight from the table: through the store an expired row looks
    // absent whether a purge deleted it or not.
    Fixture::new(store, guard).with_stored_count(move || {
        let (pool, table) = (pool.clone(), table.clone());
        async move {
            let sql = format!("SELECT COUNT(*) FROM {table}");
            let rows: i64 = sqlx::query_scalar(&sql)
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("cannot count the rows of {table}: {e}"));
            usize::try_from(rows).expect("a row count is never negative")
        }
    })
}

idem_conformance::store_tests!(factory);

/// The whole kit again, through a near cache in front of the store.
mod near_cache {
    async fn factory() -> idem_conformance::Fixture {
        super::factory().await.with_near_cache()
    }

    idem_conformance::store_tests!(factory);
}
