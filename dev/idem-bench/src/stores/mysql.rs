//! MariaDB: `MySqlStore` against its bare claim and complete statements on
//! the same sqlx pool, with round trips from the pool's own session
//! counters.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Record, Store};
use idem_mysql::MySqlStore;
use sqlx::{Executor, Row};

use crate::bench::{Bench, Contestant, Counters};
use crate::fixture::BoxError;
use crate::report::Report;
use crate::stores::sql;
use crate::stores::target::{self, Footprint, Target};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The MariaDB rows and their shared pool.
pub(crate) struct MySqlBench {
    store: MySqlStore,
}

impl std::fmt::Debug for MySqlBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlBench")
            .field("table", &self.store.table())
            .finish_non_exhaustive()
    }
}

impl MySqlBench {
    /// Connects the store's pool (sqlx's defaults, as `connect` gives a
    /// user) and creates a table for this run.
    pub(crate) async fn connect(url: &str, tag: &str) -> Result<MySqlBench, BoxError> {
        let store = tokio::time::timeout(CONNECT_TIMEOUT, MySqlStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??
            .with_table(&format!("idem_bench_{tag}"))?;
        store.migrate().await?;
        sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS `idem_bench_{tag}_charges` \
             (`key` VARBINARY(1024) NOT NULL, amount BIGINT NOT NULL) ENGINE = InnoDB"
        ))
        .execute(store.pool())
        .await?;
        Ok(MySqlBench { store })
    }

    /// Statements executed so far on every connection of the pool: the
    /// prepared ones, and the `BEGIN`/`COMMIT`/`ROLLBACK` sqlx sends as
    /// text for a transaction. The server is shared, so its global counters
    /// would count other clients too; each session's own `Com_*` counters
    /// count only this pool's statements, and the `SHOW` that reads them is
    /// not one of them.
    async fn read_counters(&self) -> Result<Counters, BoxError> {
        let pool = self.store.pool();
        let mut held = Vec::new();
        for _ in 0..pool.size() {
            match tokio::time::timeout(Duration::from_millis(200), pool.acquire()).await {
                Ok(conn) => held.push(conn?),
                Err(_) => break,
            }
        }
        let mut total = 0_u64;
        for conn in &mut held {
            // A bare string goes as text, not as a prepared statement.
            let rows = (&mut **conn)
                .fetch_all(
                    "SHOW SESSION STATUS WHERE Variable_name IN \
                     ('Com_stmt_execute', 'Com_begin', 'Com_commit', 'Com_rollback')",
                )
                .await?;
            for row in rows {
                let value: String = row.try_get(1)?;
                total += value.parse::<u64>()?;
            }
        }
        Ok(Counters::from([("stmt".to_owned(), total)]))
    }
}

#[async_trait]
impl Bench for MySqlBench {
    fn store(&self) -> &'static str {
        "mysql"
    }

    fn contestants(&self) -> Vec<Contestant> {
        let insert = format!(
            "INSERT INTO `{}_charges` (`key`, amount) VALUES (?, ?)",
            self.store.table()
        );
        sql::contestants(&self.store, insert, |d| d.get("stmt").copied().unwrap_or(0))
    }

    async fn tidy(&self) -> Result<(), BoxError> {
        Ok(())
    }

    async fn counters(&self) -> Result<Option<Counters>, BoxError> {
        Ok(self.read_counters().await.ok())
    }

    async fn finish(&self, _report: &mut Report) -> Result<(), BoxError> {
        let table = self.store.table();
        // The name was built by this harness and validated by the store.
        sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS `{table}`, `{table}_charges`"
        ))
        .execute(self.store.pool())
        .await?;
        Ok(())
    }
}

/// MariaDB in its own table; bulk rows from the Sequence engine's
/// `seq_<from>_to_<to>` tables.
pub(crate) struct MySqlTarget {
    store: Arc<MySqlStore>,
}

impl MySqlTarget {
    pub(crate) async fn connect(url: &str, tag: &str) -> Result<MySqlTarget, BoxError> {
        let store = tokio::time::timeout(target::CONNECT_TIMEOUT, MySqlStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??
            .with_table(&format!("idem_bench_{tag}"))?;
        store.migrate().await?;
        Ok(MySqlTarget {
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
impl Target for MySqlTarget {
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
            let end = (at + target::SQL_CHUNK).min(to);
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
                .bind(target::BULK_RETENTION.as_secs() as i64)
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
