//! The purge's plan, counted by the server: a batch reads about its own
//! size from the deadline index however many records have expired and
//! whatever the planner's statistics say.

use idem_core::store::Store;
use idem_postgres::sqlx;

use crate::support;

const ROWS: i64 = 30_000;
const EXPIRED: i64 = 6_000;
const BATCH: usize = 1_000;

// At ten million records a purge batch once took seconds: statistics from
// the last ANALYZE said no record had expired, and the delete's second
// expiry test made the planner walk every expired record for each batch.
// The same conditions at a small size: analyzed while every record was
// live, then many expired, with autovacuum kept off the table.
#[tokio::test]
async fn a_purge_batch_reads_its_own_size_whatever_the_statistics_say() {
    // One connection, so the store's statistics can be flushed from it.
    let Some(pool) = support::pool(1).await else {
        return;
    };
    let Some(observer) = support::pool(1).await else {
        return;
    };
    let (store, _guard) = support::store_in(pool.clone()).await;
    let table = store.table();
    for statement in [
        format!("ALTER TABLE {table} SET (autovacuum_enabled = false)"),
        format!(
            "INSERT INTO {table} (key, token, fingerprint, state, payload, lease_until, retain_until) \
             SELECT 'k' || lpad(i::text, 6, '0'), decode(repeat('07', 16), 'hex'), \
                    decode(repeat('01', 33), 'hex'), 1, '\\x', NULL, now() + interval '1 hour' \
             FROM generate_series(1, {ROWS}) AS i"
        ),
        format!("ANALYZE {table}"),
        format!(
            "UPDATE {table} SET retain_until = now() - interval '1 minute' \
             WHERE key <= 'k' || lpad('{EXPIRED}', 6, '0')"
        ),
    ] {
        sqlx::raw_sql(&statement).execute(&pool).await.unwrap();
    }
    let index_reads = || async {
        // Flushed by the store's own connection, as round_trips.rs does;
        // the lookup by key gives it table statistics to flush.
        sqlx::raw_sql(&format!(
            "SELECT pg_stat_force_next_flush(); SELECT 1 FROM {table} WHERE key = 'none'"
        ))
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query_scalar::<_, i64>(
            "SELECT idx_tup_read FROM pg_stat_user_indexes \
             WHERE relid = to_regclass($1) AND indexrelname NOT LIKE '%pkey'",
        )
        .bind(&table)
        .fetch_one(&observer)
        .await
        .unwrap()
    };
    let before = index_reads().await;
    assert_eq!(store.purge_expired(BATCH).await.unwrap(), BATCH);
    let read = index_reads().await - before;
    assert!(
        read <= 2 * BATCH as i64,
        "one batch of {BATCH} read {read} deadline-index entries with {EXPIRED} expired"
    );
    let mut purged = BATCH;
    while let Ok(n @ 1..) = store.purge_expired(BATCH).await {
        purged += n;
    }
    assert_eq!(purged as i64, EXPIRED);
}
