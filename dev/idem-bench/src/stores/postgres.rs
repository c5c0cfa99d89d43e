//! PostgreSQL: `PostgresStore` against its bare claim and complete
//! statements on the same sqlx pool, with round trips from
//! `pg_stat_database`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Record, Store};
use idem_core::Idempotent;
use idem_postgres::PostgresStore;
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::Mutex;

use crate::bench::{Bench, Contestant, Counters, Kind};
use crate::fixture::BoxError;
use crate::protocols::StepsRow;
use crate::report::Report;
use crate::runner::Protocol;
use crate::stores::sql;
use crate::stores::target::{self, Footprint, Target};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The PostgreSQL rows, their shared pool, and a connection of the
/// harness's own for reading counters.
pub(crate) struct PostgresBench {
    store: PostgresStore,
    observer: Mutex<PgConnection>,
    /// Transactions the harness itself committed while reading counters:
    /// subtracted, so the counts are the rows' own (and other clients').
    own: AtomicU64,
}

impl std::fmt::Debug for PostgresBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBench")
            .field("table", &self.store.table())
            .finish_non_exhaustive()
    }
}

impl PostgresBench {
    /// Connects the store's pool (sqlx's defaults, as `connect` gives a
    /// user) and a counter connection, and creates a table for this run.
    pub(crate) async fn connect(url: &str, tag: &str) -> Result<PostgresBench, BoxError> {
        let store = tokio::time::timeout(CONNECT_TIMEOUT, PostgresStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??
            .with_table(&format!("idem_bench_{tag}"))?;
        store.migrate().await?;
        sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS \"idem_bench_{tag}_charges\" (key text NOT NULL, amount int8 NOT NULL)"
        ))
        .execute(store.pool())
        .await?;
        let observer = PgConnection::connect(url).await?;
        Ok(PostgresBench {
            store,
            observer: Mutex::new(observer),
            own: AtomicU64::new(0),
        })
    }

    /// Makes every pooled connection publish its pending statistics:
    /// PostgreSQL flushes a backend's counters at most once a second, and
    /// an idle one only after up to ten, so without this a run's delta
    /// would miss its tail. Each flush is itself one transaction.
    async fn flush_pool(&self) -> Result<u64, BoxError> {
        let pool = self.store.pool();
        let mut held = Vec::new();
        for _ in 0..pool.size() {
            match tokio::time::timeout(Duration::from_millis(200), pool.acquire()).await {
                Ok(conn) => held.push(conn?),
                Err(_) => break,
            }
        }
        let flushed = held.len() as u64;
        for conn in &mut held {
            sqlx::query("SELECT pg_stat_force_next_flush()")
                .execute(&mut **conn)
                .await?;
        }
        Ok(flushed)
    }

    /// Transactions committed or rolled back in this database so far, less
    /// the harness's own.
    async fn read_counters(&self) -> Result<Counters, BoxError> {
        let flushed = self.flush_pool().await?;
        let mut observer = self.observer.lock().await;
        // The read itself is a transaction, flushed with the next one.
        let row = sqlx::query(
            "SELECT (xact_commit + xact_rollback)::int8, pg_stat_force_next_flush() IS NULL \
             FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut *observer)
        .await?;
        let own = self.own.fetch_add(flushed + 1, Ordering::Relaxed) + flushed;
        let total: i64 = row.try_get(0)?;
        Ok(Counters::from([(
            "xact".to_owned(),
            (total.max(0) as u64).saturating_sub(own),
        )]))
    }
}

#[async_trait]
impl Bench for PostgresBench {
    fn store(&self) -> &'static str {
        "postgres"
    }

    fn contestants(&self) -> Vec<Contestant> {
        let insert = format!(
            "INSERT INTO \"{}_charges\" (key, amount) VALUES ($1, $2)",
            self.store.table()
        );
        let transactions = |d: &Counters| d.get("xact").copied().unwrap_or(0);
        let mut contestants = sql::contestants(&self.store, insert, transactions);
        let store: Arc<dyn Store> = Arc::new(self.store.clone());
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

    async fn tidy(&self) -> Result<(), BoxError> {
        Ok(())
    }

    async fn counters(&self) -> Result<Option<Counters>, BoxError> {
        // A server without the statistics functions (before PostgreSQL 15)
        // gets no round-trip figures rather than no benchmark.
        Ok(self.read_counters().await.ok())
    }

    async fn finish(&self, _report: &mut Report) -> Result<(), BoxError> {
        let table = self.store.table();
        // The name was built by this harness and validated by the store.
        sqlx::query(&format!(
            "DROP TABLE IF EXISTS \"{table}\", \"{table}_charges\""
        ))
        .execute(self.store.pool())
        .await?;
        Ok(())
    }
}

/// PostgreSQL in its own table; bulk rows from `generate_series`.
pub(crate) struct PostgresTarget {
    store: Arc<PostgresStore>,
}

impl PostgresTarget {
    pub(crate) async fn connect(
        url: &str,
        tag: &str,
        notifications: bool,
    ) -> Result<PostgresTarget, BoxError> {
        let store = tokio::time::timeout(target::CONNECT_TIMEOUT, PostgresStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??
            .with_table(&format!("idem_bench_{tag}"))?
            .with_notifications(notifications);
        store.migrate().await?;
        Ok(PostgresTarget {
            store: Arc::new(store),
        })
    }

    /// The table's name as a quoted identifier (the store validated it).
    fn table(&self) -> String {
        format!("\"{}\"", self.store.table())
    }
}

#[async_trait]
impl Target for PostgresTarget {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn fill(
        &self,
        prefix: &str,
        template: &str,
        _record: &Record,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError> {
        let t = self.table();
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
                .execute(self.store.pool())
                .await?;
            at = end;
        }
        // What autovacuum does to a table after a bulk load, done now so
        // that the measured part runs on a settled table with fresh
        // statistics and a set visibility map.
        sqlx::raw_sql(&format!("VACUUM (ANALYZE) {t}"))
            .execute(self.store.pool())
            .await?;
        Ok(())
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        let row = sqlx::query(
            "SELECT pg_total_relation_size($1::regclass), pg_relation_size($1::regclass), \
             pg_indexes_size($1::regclass)",
        )
        .bind(self.table())
        .fetch_one(self.store.pool())
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
        .bind(self.table())
        .fetch_one(self.store.pool())
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

    async fn rows(&self) -> Result<Option<u64>, BoxError> {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", self.table()))
            .fetch_one(self.store.pool())
            .await?;
        Ok(Some(n as u64))
    }

    async fn after_churn(&self) -> Result<Vec<String>, BoxError> {
        let row = sqlx::query(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count, \
             coalesce(last_autovacuum::text, 'never'), \
             pg_relation_size(relid), pg_indexes_size(relid) \
             FROM pg_stat_user_tables WHERE relid = $1::regclass",
        )
        .bind(self.table())
        .fetch_one(self.store.pool())
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

    async fn remove_all(&self) -> Result<(), BoxError> {
        sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {}", self.table()))
            .execute(self.store.pool())
            .await?;
        Ok(())
    }
}
