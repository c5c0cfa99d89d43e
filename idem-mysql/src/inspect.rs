//! [`Inspect`] for [`MySqlStore`]: listing and counting records.

use async_trait::async_trait;
use idem_core::inspect::{page_limit, Inspect, Listed, Listing, Page, Stats};
use idem_core::store::StoreError;
use sqlx::Row;

use crate::error::error;
use crate::row::record;
use crate::MySqlStore;

// The clock and the remaining-time columns exactly as the store's own
// statements read them (see `table.rs`), so `row::record` decodes them.
const NOW: &str = "UTC_TIMESTAMP(6)";

fn left(column: &str) -> String {
    format!("TIMESTAMPDIFF(MICROSECOND, {NOW}, {column})")
}

impl MySqlStore {
    fn list_sql(&self) -> String {
        // Pages walk the primary key (binary, so byte order).
        format!(
            "SELECT token, fingerprint, state, payload, {}, {}, `key` FROM {} \
             WHERE state = ? AND retain_until > {NOW} AND `key` > ? \
             ORDER BY `key` LIMIT ?",
            left("lease_until"),
            left("retain_until"),
            self.sql.name.quoted()
        )
    }

    fn stats_sql(&self) -> String {
        let live = format!("retain_until > {NOW}");
        let count = |condition: String| format!("CAST(COALESCE(SUM({condition}), 0) AS SIGNED)");
        format!(
            "SELECT {}, {}, {}, {}, {} FROM {}",
            count(format!("{live} AND state = 0 AND lease_until > {NOW}")),
            count(format!(
                "{live} AND state = 0 AND (lease_until IS NULL OR lease_until <= {NOW})"
            )),
            count(format!("{live} AND state = 1")),
            count(format!("{live} AND state = 2")),
            count(format!("retain_until <= {NOW}")),
            self.sql.name.quoted()
        )
    }
}

#[async_trait]
impl Inspect for MySqlStore {
    async fn list(
        &self,
        listing: Listing,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let limit = page_limit(limit);
        let rows = sqlx::query(&self.list_sql())
            .bind(listing.state().as_u8())
            .bind(after.unwrap_or("").as_bytes())
            .bind(u64::try_from(limit).unwrap_or(u64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(error)?;
        let records = rows
            .iter()
            .map(|row| {
                let key: Vec<u8> = row.try_get(6).map_err(error)?;
                Ok(Listed {
                    // Keys are written from `&str`, so they are UTF-8.
                    key: String::from_utf8_lossy(&key).into_owned(),
                    record: record(row)?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let next = (records.len() == limit)
            .then(|| records.last().map(|last| last.key.clone()))
            .flatten();
        Ok(Page { records, next })
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let row = sqlx::query(&self.stats_sql())
            .fetch_one(&self.pool)
            .await
            .map_err(error)?;
        let count = |i: usize| -> Result<u64, StoreError> {
            let n: i64 = row.try_get(i).map_err(error)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let mut stats = Stats::default();
        stats.in_flight = count(0)?;
        stats.lapsed = count(1)?;
        stats.completed = count(2)?;
        stats.failed = count(3)?;
        stats.expired = count(4)?;
        Ok(stats)
    }
}
