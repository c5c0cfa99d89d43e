//! MariaDB: `MySqlStore` against its bare claim and complete statements on
//! the same sqlx pool, with round trips from the pool's own session
//! counters; bulk rows from the Sequence engine's `seq_<from>_to_<to>`
//! tables.

use async_trait::async_trait;
use idem_mysql::MySqlStore;
use sqlx::{Executor, Row};

use crate::bench::{Contestant, Counters};
use crate::fixture::BoxError;
use crate::stores::sql::{self, SqlStore};
use crate::stores::sql_bench::{hold_all, Dialect, SqlBench, SqlTarget};
use crate::stores::target::{self, Footprint};

/// The MariaDB rows and their shared pool.
pub(crate) type MySqlBench = SqlBench<MySqlStore>;

/// MariaDB in its own table.
pub(crate) type MySqlTarget = SqlTarget<MySqlStore>;

#[async_trait]
impl Dialect for MySqlStore {
    const NAME: &'static str = "mysql";

    type Observer = ();

    fn quote(name: &str) -> String {
        format!("`{name}`")
    }

    fn charges_table(table: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {table} \
             (`key` VARBINARY(1024) NOT NULL, amount BIGINT NOT NULL) ENGINE = InnoDB"
        )
    }

    fn charge_insert(table: &str) -> String {
        format!("INSERT INTO {table} (`key`, amount) VALUES (?, ?)")
    }

    async fn observer(_url: &str) -> Result<(), BoxError> {
        Ok(())
    }

    /// Statements executed so far on every connection of the pool: the
    /// prepared ones, and the `BEGIN`/`COMMIT`/`ROLLBACK` sqlx sends as
    /// text for a transaction. The server is shared, so its global counters
    /// would count other clients too; each session's own `Com_*` counters
    /// count only this pool's statements, and the `SHOW` that reads them is
    /// not one of them.
    async fn read_counters(&self, _observer: &()) -> Result<Counters, BoxError> {
        let mut total = 0_u64;
        for conn in &mut hold_all(SqlStore::pool(self)).await? {
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

    fn contestants(&self, insert: String) -> Vec<Contestant> {
        sql::contestants(self, insert, |d| d.get("stmt").copied().unwrap_or(0))
    }

    async fn fill(
        &self,
        t: &str,
        prefix: &str,
        template: &str,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError> {
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
                .execute(SqlStore::pool(self))
                .await?;
            at = end;
        }
        Ok(())
    }

    async fn footprint(&self, table: &str) -> Result<Footprint, BoxError> {
        let (data, index, free) = sizes(self, table).await?;
        // Whether pages came from the buffer pool or from the disk: the
        // server's own counters since it started (other clients' too).
        // A bare string goes as text, not as a prepared statement.
        let rows = SqlStore::pool(self)
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

    async fn after_churn(&self, table: &str) -> Result<Vec<String>, BoxError> {
        let (data, index, free) = sizes(self, table).await?;
        Ok(vec![format!(
            "data {data} B, indexes {index} B, free space in the tablespace {free} B"
        )])
    }
}

/// Data, index and free bytes of `table` (quoted) from
/// `information_schema`, after refreshing the table's statistics.
async fn sizes(store: &MySqlStore, table: &str) -> Result<(u64, u64, u64), BoxError> {
    store.raw(&format!("ANALYZE TABLE {table}")).await?;
    let row = sqlx::query(
        "SELECT CAST(data_length AS SIGNED), CAST(index_length AS SIGNED), \
         CAST(data_free AS SIGNED) FROM information_schema.TABLES \
         WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(store.table())
    .fetch_one(store.pool())
    .await?;
    let (data, index, free): (i64, i64, i64) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    Ok((data as u64, index as u64, free as u64))
}
