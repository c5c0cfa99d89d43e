//! Each store as the scale mode fills, weighs and empties it: bulk loading
//! in the store's own record format, the bytes its records take, and the
//! figures its maintenance leaves behind after churn.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Store, Token};
use idem_core::MemoryStore;
use idem_mysql::MySqlStore;
use idem_postgres::PostgresStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use idem_stores::StoreKind;
use redis::aio::MultiplexedConnection;
use sqlx::{Executor, Row};
use tempfile::TempDir;
use tokio::task::JoinSet;

use crate::fixture::BoxError;
use crate::stores::{self, Places};

/// How long bulk records are kept: far beyond any run, as a service with
/// the default retention keeps its records, and short enough that a run
/// killed before its cleanup leaves nothing for long.
pub(crate) const BULK_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows one bulk statement inserts: bounded, so that no transaction grows
/// with the target size.
const SQL_CHUNK: u64 = 250_000;

/// What the store's records take, and how that was measured.
#[derive(Debug, Clone)]
pub(crate) struct Footprint {
    pub(crate) bytes: u64,
    pub(crate) how: String,
}

/// One store under the scale mode.
#[async_trait]
pub(crate) trait Target: Send + Sync {
    /// The store's name in the report.
    fn name(&self) -> &'static str;
    /// The store, as `execute` and the purger use it.
    fn store(&self) -> Arc<dyn Store>;
    /// Adds one record under each stored key `{prefix}{n}`, `n` in
    /// `from..to`: a copy of `record`, the live record under the stored key
    /// `template`, with a fresh token and [`BULK_RETENTION`].
    async fn fill(
        &self,
        prefix: &str,
        template: &str,
        record: &Record,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError>;
    /// What the store's records take now (after the store's own
    /// housekeeping a long-lived deployment would have run).
    async fn footprint(&self) -> Result<Footprint, BoxError>;
    /// Rows the store holds, expired ones included, where it can count them
    /// cheaply enough.
    async fn rows(&self) -> Result<Option<u64>, BoxError>;
    /// Store-specific figures after the churn: bloat, dead tuples, file size.
    async fn after_churn(&self) -> Result<Vec<String>, BoxError>;
    /// Removes every key, table or file the run made.
    async fn remove_all(&self) -> Result<(), BoxError>;
    /// The `limit` for clearing a backlog of expired records between
    /// measured runs.
    fn clearing_batch(&self) -> usize {
        idem_core::store::PURGE_BATCH
    }
}

/// A store's target, or why it is skipped.
pub(crate) enum Opened {
    Target(Box<dyn Target>),
    Skipped(String, BoxError),
}

/// Opens `kind` on a table, prefix or file named after `tag`.
pub(crate) async fn open(
    kind: StoreKind,
    places: Places<'_>,
    tag: &str,
) -> Result<Opened, BoxError> {
    fn server<T: Target + 'static>(url: &str, target: Result<T, BoxError>) -> Opened {
        match target {
            Ok(target) => Opened::Target(Box::new(target)),
            Err(reason) => Opened::Skipped(url.to_owned(), reason),
        }
    }
    Ok(match kind {
        StoreKind::Memory => Opened::Target(Box::new(Memory::new())),
        StoreKind::Sqlite => Opened::Target(Box::new(
            Sqlite::open(places.sqlite_dir, places.sqlite_mmap, tag).await?,
        )),
        StoreKind::Redis => server(
            places.redis_url,
            Redis::connect(places.redis_url, tag).await,
        ),
        StoreKind::Postgres => server(
            places.postgres_url,
            Postgres::connect(places.postgres_url, tag).await,
        ),
        StoreKind::MySql => server(
            places.mysql_url,
            MySql::connect(places.mysql_url, tag).await,
        ),
        other => Opened::Skipped(
            other.name().to_owned(),
            "the scale mode has no bulk loader for it yet".into(),
        ),
    })
}

/// Inserts the bulk records one `insert` each, from `callers` concurrent callers:
/// for the stores without a server-side bulk path (memory, whose inserts
/// are in-process, and Redis, whose client pipelines concurrent commands
/// on its one connection).
async fn fill_through_store(
    store: Arc<dyn Store>,
    callers: usize,
    prefix: &str,
    record: &Record,
    from: u64,
    to: u64,
) -> Result<(), BoxError> {
    let next = Arc::new(AtomicU64::new(from));
    let record = Arc::new(record.clone());
    let mut workers = JoinSet::new();
    for _ in 0..callers {
        let (store, next, record) = (store.clone(), next.clone(), record.clone());
        let prefix = prefix.to_owned();
        workers.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= to {
                    return Ok::<(), BoxError>(());
                }
                let new = NewRecord {
                    token: Token::random(),
                    fingerprint: record.fingerprint,
                    state: record.state,
                    payload: &record.payload,
                    lease: None,
                    retention: BULK_RETENTION,
                };
                match store.insert(&format!("{prefix}{n}"), &new).await? {
                    Insert::Inserted => {}
                    _ => return Err(format!("bulk key {prefix}{n} was already there").into()),
                }
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.map_err(|e| format!("a bulk loader stopped: {e}"))??;
    }
    Ok(())
}

/// This process's resident memory, from `/proc/self/statm` (Linux).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The in-process store; its records are weighed by the process's resident
/// memory growth.
struct Memory {
    store: Arc<MemoryStore>,
    resident_at_open: u64,
}

impl Memory {
    fn new() -> Memory {
        Memory {
            store: Arc::new(MemoryStore::new()),
            resident_at_open: resident_bytes().unwrap_or(0),
        }
    }
}

#[async_trait]
impl Target for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn fill(
        &self,
        prefix: &str,
        _template: &str,
        record: &Record,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError> {
        fill_through_store(self.store.clone(), 64, prefix, record, from, to).await
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        let now = resident_bytes().ok_or("no /proc/self/statm to read resident memory from")?;
        Ok(Footprint {
            bytes: now.saturating_sub(self.resident_at_open),
            how: "the process's resident memory growth since the store opened".to_owned(),
        })
    }

    async fn rows(&self) -> Result<Option<u64>, BoxError> {
        Ok(Some(self.store.len() as u64))
    }

    async fn after_churn(&self) -> Result<Vec<String>, BoxError> {
        Ok(vec![format!("records held {}", self.store.len())])
    }

    async fn remove_all(&self) -> Result<(), BoxError> {
        // Dropped with the target.
        Ok(())
    }

    fn clearing_batch(&self) -> usize {
        // Each purge call scans the map from its start, so clearing a
        // backlog in batches costs a scan per batch: one call, one scan.
        usize::MAX
    }
}

/// SQLite in its own file; bulk rows go in through a second connection,
/// one `INSERT … SELECT` over a recursive series per chunk.
struct Sqlite {
    store: Arc<SqliteStore>,
    path: PathBuf,
    _dir: Option<TempDir>,
}

impl Sqlite {
    async fn open(dir: Option<&Path>, mmap: Option<u64>, tag: &str) -> Result<Sqlite, BoxError> {
        let (temp, dir) = match dir {
            Some(dir) => (None, dir.to_path_buf()),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("idem-bench-scale")
                    .tempdir()?;
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };
        let path = dir.join(format!("{tag}-scale.db"));
        let mut store = SqliteStore::open(&path).await?;
        if let Some(bytes) = mmap {
            store = store.with_mmap_size(bytes);
        }
        Ok(Sqlite {
            store: Arc::new(store),
            path,
            _dir: temp,
        })
    }

    /// Runs `f` on a fresh connection to the file, off the runtime.
    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, BoxError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let conn = rusqlite::Connection::open(&path)?;
            conn.busy_timeout(Duration::from_secs(60))?;
            f(&conn)
        })
        .await?
        .map_err(Into::into)
    }

    fn wal(&self) -> PathBuf {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        wal.into()
    }

    fn file_sizes(&self) -> (u64, u64) {
        let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        (size(&self.path), size(&self.wal()))
    }
}

#[async_trait]
impl Target for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
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
        let (prefix, template) = (prefix.to_owned(), template.to_owned());
        let retain_us = i64::try_from(BULK_RETENTION.as_micros()).unwrap_or(i64::MAX);
        self.with_conn(move |conn| {
            let mut at = from;
            while at < to {
                let end = (at + SQL_CHUNK).min(to);
                // Deadlines are unix microseconds in this table.
                conn.execute(
                    "WITH RECURSIVE s(n) AS (SELECT ?2 UNION ALL SELECT n + 1 FROM s WHERE n < ?3) \
                     INSERT INTO idem_records \
                     (key, token, fingerprint, state, payload, lease_until, retain_until) \
                     SELECT ?1 || s.n, randomblob(16), t.fingerprint, t.state, t.payload, NULL, \
                     CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER) + ?5 \
                     FROM (SELECT * FROM idem_records WHERE key = ?4) AS t CROSS JOIN s",
                    rusqlite::params![prefix, at as i64, end as i64 - 1, template, retain_us],
                )?;
                at = end;
            }
            Ok(())
        })
        .await
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        // A checkpoint folds the log into the file, as the store's own
        // automatic checkpoints do over time.
        self.with_conn(|conn| conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())))
            .await?;
        let (file, wal) = self.file_sizes();
        Ok(Footprint {
            bytes: file + wal,
            how: format!("file {file} B + log {wal} B after a checkpoint"),
        })
    }

    async fn rows(&self) -> Result<Option<u64>, BoxError> {
        let n: i64 = self
            .with_conn(|conn| conn.query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0)))
            .await?;
        Ok(Some(n as u64))
    }

    async fn after_churn(&self) -> Result<Vec<String>, BoxError> {
        let (file, wal) = self.file_sizes();
        let (free, page): (i64, i64) = self
            .with_conn(|conn| {
                let free = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
                let page = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
                Ok((free, page))
            })
            .await?;
        Ok(vec![format!(
            "file {file} B, log {wal} B, free pages {free} ({} B) awaiting reuse",
            free * page
        )])
    }

    async fn remove_all(&self) -> Result<(), BoxError> {
        for path in [self.path.clone(), self.wal(), {
            let mut shm = self.path.clone().into_os_string();
            shm.push("-shm");
            shm.into()
        }] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Redis under its own key prefix, weighed by `used_memory` growth.
struct Redis {
    store: Arc<RedisStore>,
    admin: MultiplexedConnection,
    prefix: String,
    used_at_open: u64,
}

impl Redis {
    async fn connect(url: &str, tag: &str) -> Result<Redis, BoxError> {
        let mut admin = stores::redis::admin_connection(url).await?;
        let store = tokio::time::timeout(CONNECT_TIMEOUT, RedisStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??;
        let prefix = format!("idem-bench-scale:{tag}:");
        let used_at_open = used_memory(&mut admin).await?;
        Ok(Redis {
            store: Arc::new(store.with_prefix(prefix.clone())),
            admin,
            prefix,
            used_at_open,
        })
    }
}

/// `used_memory` from `INFO memory`.
async fn used_memory(admin: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(admin).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".into())
}

#[async_trait]
impl Target for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn fill(
        &self,
        prefix: &str,
        _template: &str,
        record: &Record,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError> {
        // Sixteen callers keep the pipeline short enough that no reply
        // waits past the store's response timeout on a loaded machine
        // (64 did, at 10M records).
        fill_through_store(self.store.clone(), 16, prefix, record, from, to).await
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        let used = used_memory(&mut self.admin.clone()).await?;
        Ok(Footprint {
            bytes: used.saturating_sub(self.used_at_open),
            how: "used_memory growth since the run began (a shared server: \
                  other clients' keys count too)"
                .to_owned(),
        })
    }

    async fn rows(&self) -> Result<Option<u64>, BoxError> {
        // Counting one prefix among a shared server's keys means a full SCAN.
        Ok(None)
    }

    async fn after_churn(&self) -> Result<Vec<String>, BoxError> {
        let mut admin = self.admin.clone();
        let used = used_memory(&mut admin).await?;
        Ok(vec![format!(
            "used_memory {used} B ({} B above the run's start); expired keys are \
             removed by the server itself",
            used.saturating_sub(self.used_at_open)
        )])
    }

    async fn remove_all(&self) -> Result<(), BoxError> {
        stores::redis::unlink_prefix(&mut self.admin.clone(), &self.prefix).await
    }
}

/// PostgreSQL in its own table; bulk rows from `generate_series`.
struct Postgres {
    store: Arc<PostgresStore>,
}

impl Postgres {
    async fn connect(url: &str, tag: &str) -> Result<Postgres, BoxError> {
        let store = tokio::time::timeout(CONNECT_TIMEOUT, PostgresStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??
            .with_table(&format!("idem_scale_{tag}"))?;
        store.migrate().await?;
        Ok(Postgres {
            store: Arc::new(store),
        })
    }

    /// The table's name as a quoted identifier (the store validated it).
    fn table(&self) -> String {
        format!("\"{}\"", self.store.table())
    }
}

#[async_trait]
impl Target for Postgres {
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
            BULK_RETENTION.as_secs()
        );
        let mut at = from;
        while at < to {
            let end = (at + SQL_CHUNK).min(to);
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

/// MariaDB in its own table; bulk rows from the Sequence engine's
/// `seq_<from>_to_<to>` tables.
struct MySql {
    store: Arc<MySqlStore>,
}

impl MySql {
    async fn connect(url: &str, tag: &str) -> Result<MySql, BoxError> {
        let store = tokio::time::timeout(CONNECT_TIMEOUT, MySqlStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??
            .with_table(&format!("idem_scale_{tag}"))?;
        store.migrate().await?;
        Ok(MySql {
            store: Arc::new(store),
        })
    }

    fn table(&self) -> String {
        format!("`{}`", self.store.table())
    }

    /// Data, index and free bytes from `information_schema`, after
    /// refreshing the table's statistics.
    async fn sizes(&self) -> Result<(u64, u64, u64), BoxError> {
        sqlx::raw_sql(&format!("ANALYZE TABLE {}", self.table()))
            .execute(self.store.pool())
            .await?;
        let row = sqlx::query(
            "SELECT CAST(data_length AS SIGNED), CAST(index_length AS SIGNED), \
             CAST(data_free AS SIGNED) FROM information_schema.TABLES \
             WHERE table_schema = DATABASE() AND table_name = ?",
        )
        .bind(self.store.table())
        .fetch_one(self.store.pool())
        .await?;
        let (data, index, free): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        Ok((data as u64, index as u64, free as u64))
    }
}

#[async_trait]
impl Target for MySql {
    fn name(&self) -> &'static str {
        "mysql"
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
        let mut at = from;
        while at < to {
            let end = (at + SQL_CHUNK).min(to);
            // The bounds are numbers this loop made: safe in the name.
            let insert = format!(
                "INSERT INTO {t} \
                 (`key`, token, fingerprint, state, payload, lease_until, retain_until) \
                 SELECT CONCAT(?, s.seq), UNHEX(MD5(RAND())), tpl.fingerprint, tpl.state, \
                 tpl.payload, NULL, UTC_TIMESTAMP(6) + INTERVAL ? SECOND \
                 FROM (SELECT fingerprint, state, payload FROM {t} WHERE `key` = ?) AS tpl, \
                 seq_{at}_to_{} AS s",
                end - 1
            );
            sqlx::query(&insert)
                .bind(prefix)
                .bind(BULK_RETENTION.as_secs() as i64)
                .bind(template)
                .execute(self.store.pool())
                .await?;
            at = end;
        }
        Ok(())
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        let (data, index, free) = self.sizes().await?;
        // Whether pages came from the buffer pool or from the disk: the
        // server's own counters since it started (other clients' too).
        // A bare string goes as text, not as a prepared statement.
        let rows = self
            .store
            .pool()
            .fetch_all("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_read%'")
            .await?;
        let mut status = Vec::new();
        for row in rows {
            let (name, value): (String, String) = (row.try_get(0)?, row.try_get(1)?);
            if name.ends_with("_reads") || name.ends_with("_read_requests") {
                status.push(format!("{name} {value}"));
            }
        }
        Ok(Footprint {
            bytes: data + index,
            how: format!(
                "information_schema after ANALYZE: data {data} B, indexes {index} B \
                 (free space {free} B not counted); {}",
                status.join(", ")
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
        let (data, index, free) = self.sizes().await?;
        Ok(vec![format!(
            "data {data} B, indexes {index} B, free space in the tablespace {free} B"
        )])
    }

    async fn remove_all(&self) -> Result<(), BoxError> {
        sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {}", self.table()))
            .execute(self.store.pool())
            .await?;
        Ok(())
    }
}
