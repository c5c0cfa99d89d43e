//! PostgreSQL: `PostgresStore` against its bare claim and complete
//! statements on the same sqlx pool, with round trips from
//! `pg_stat_database`; bulk rows from `generate_series`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::Store;
use idem_core::Idempotent;
use idem_postgres::PostgresStore;
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::Mutex;

use crate::bench::{Contestant, Counters, Kind};
use crate::fixture::BoxError;
use crate::protocols::StepsRow;
use crate::runner::Protocol;
use crate::stores::sql::{self, SqlStore};
use crate::stores::sql_bench::{hold_all, Dialect, SqlBench, SqlTarget};
use crate::stores::target::{self, Footprint};

/// The PostgreSQL rows and their shared pool.
pub(crate) type PostgresBench = SqlBench<PostgresStore>;

/// PostgreSQL in its own table.
pub(crate) type PostgresTarget = SqlTarget<PostgresStore>;

/// The harness's own connection for reading counters.
pub(crate) struct Observer {
    conn: Mutex<PgConnection>,
    /// Transactions the harness itself committed while reading counters:
    /// subtracted, so the counts are the rows' own (and other clients').
    own: AtomicU64,
}

/// Makes every pooled connection publish its pending statistics:
/// PostgreSQL flushes a backend's counters at most once a second, and an
/// idle one only after up to ten, so without this a run's delta would
/// miss its tail. Each flush is itself one transaction.
async fn flush_pool(store: &PostgresStore) -> Result<u64, BoxError> {
    let mut held = hold_all(store.pool()).await?;
    let flushed = held.len() as u64;
    for conn in &mut held {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&mut **conn)
            .await?;
    }
    Ok(flushed)
}

#[async_trait]
impl Dialect for PostgresStore {
    const NAME: &'static str = "postgres";

    type Observer = Observer;

    fn quote(name: &str) -> String {
        format!("\"{name}\"")
    }

    fn charges_table(table: &str) -> String {
        format!("CREATE TABLE IF NOT EXISTS {table} (key text NOT NULL, amount int8 NOT NULL)")
    }

    fn charge_insert(table: &str) -> String {
        format!("INSERT INTO {table} (key, amount) VALUES ($1, $2)")
    }

    async fn observer(url: &str) -> Result<Observer, BoxError> {
        Ok(Observer {
            conn: Mutex::new(PgConnection::connect(url).await?),
            own: AtomicU64::new(0),
        })
    }

    /// Transactions committed or rolled back in this database so far, less
    /// the harness's own.
    async fn read_counters(&self, observer: &Observer) -> Result<Counters, BoxError> {
        let flushed = flush_pool(self).await?;
        let mut conn = observer.conn.lock().await;
        // The read itself is a transaction, flushed with the next one.
        let row = sqlx::query(
            "SELECT (xact_commit + xact_rollback)::int8, pg_stat_force_next_flush() IS NULL \
             FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut *conn)
        .await?;
        let own = observer.own.fetch_add(flushed + 1, Ordering::Relaxed) + flushed;
        let total: i64 = row.try_get(0)?;
        Ok(Counters::from([(
            "xact".to_owned(),
            (total.max(0) as u64).saturating_sub(own),
        )]))
    }

    fn contestants(&self, insert: String) -> Vec<Contestant> {
        let transactions = |d: &Counters| d.get("xact").copied().unwrap_or(0);
        let mut contestants = sql::contestants(self, insert, transactions);
        let store: Arc<dyn Store> = Arc::new(self.clone());
        let steps: Arc<dyn Protocol> = Arc::new(StepsRow::new(Idempotent::from_arc(store)));
        // After `execute`, as the report lists them.
        contestants.insert(
            2,
            Contestant {
                kind: Kind::IdemSteps,
                make: Box::new(move || steps.clone()),
                fresh: false,
                round_trips: transactions,
            },
        );
        contestants
    }

    async fn fill(
        &self,
        t: &str,
        prefix: &str,
        template: &str,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError> {
        let insert = format!(
            "INSERT INTO {t} (key, token, fingerprint, state, payload, lease_until, retain_until) \
             SELECT $1 || g::text, decode(md5(random()::text || g::text), 'hex'), \
             s.fingerprint, s.state, s.payload, NULL, now() + interval '{} seconds' \
             FROM (SELECT * FROM {t} WHERE key = $4) AS s, generate_series($2::int8, $3::int8) AS g",
            target::BULK_RETENTION.as_secs()
        );
        let mut at = from;
        while at < to {
            let end = (at + target::SQL_CHUNK).min(to);
            sqlx::query(&insert)
                .bind(prefix)
                .bind(at as i64)
                .bind(end as i64 - 1)
                .bind(template)
                .execute(SqlStore::pool(self))
                .await?;
            at = end;
        }
        // What autovacuum does to a table after a bulk load, done now so
        // that the measured part runs on a settled table with fresh
        // statistics and a set visibility map.
        self.raw(&format!("VACUUM (ANALYZE) {t}")).await?;
        Ok(())
    }

    async fn footprint(&self, table: &str) -> Result<Footprint, BoxError> {
        let row = sqlx::query(
            "SELECT pg_total_relation_size($1::regclass), pg_relation_size($1::regclass), \
             pg_indexes_size($1::regclass)",
        )
        .bind(table)
        .fetch_one(SqlStore::pool(self))
        .await?;
        let (total, heap, indexes): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        // Where the measured part's pages came from: shared buffers (hit)
        // or the kernel (read), cumulative since the table was made.
        let io = sqlx::query(
            "SELECT coalesce(heap_blks_hit, 0), coalesce(heap_blks_read, 0), \
             coalesce(idx_blks_hit, 0), coalesce(idx_blks_read, 0) \
             FROM pg_statio_user_tables WHERE relid = $1::regclass",
        )
        .bind(table)
        .fetch_one(SqlStore::pool(self))
        .await?;
        let (heap_hit, heap_read, idx_hit, idx_read): (i64, i64, i64, i64) = (
            io.try_get(0)?,
            io.try_get(1)?,
            io.try_get(2)?,
            io.try_get(3)?,
        );
        Ok(Footprint {
            bytes: total as u64,
            how: format!(
                "pg_total_relation_size: heap {heap} B, indexes {indexes} B, toast and maps {} B; \
                 blocks so far: heap hit {heap_hit} read {heap_read}, index hit {idx_hit} read {idx_read}",
                total - heap - indexes
            ),
        })
    }

    async fn after_churn(&self, table: &str) -> Result<Vec<String>, BoxError> {
        let row = sqlx::query(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count, \
             coalesce(last_autovacuum::text, 'never'), \
             pg_relation_size(relid), pg_indexes_size(relid) \
             FROM pg_stat_user_tables WHERE relid = $1::regclass",
        )
        .bind(table)
        .fetch_one(SqlStore::pool(self))
        .await?;
        let (live, dead, vacuums): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let last: String = row.try_get(3)?;
        let (heap, indexes): (i64, i64) = (row.try_get(4)?, row.try_get(5)?);
        Ok(vec![format!(
            "live tuples {live}, dead tuples {dead}, autovacuums {vacuums} (last {last}), \
             heap {heap} B, indexes {indexes} B"
        )])
    }
}
