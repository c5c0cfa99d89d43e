//! [`Inspect`] for [`PostgresStore`]: listing and counting records.

use async_trait::async_trait;
use idem_core::inspect::{page_limit, Inspect, Listed, Listing, Page, Stats};
use idem_core::store::StoreError;
use sqlx::Row;

use crate::error::error;
use crate::row::record;
use crate::PostgresStore;

// The clock and the remaining-time columns exactly as the store's own
// statements read them (see `table.rs`), so `row::record` decodes them.
const NOW: &str = "statement_timestamp()";

fn left(column: &str) -> String {
    format!("(extract(epoch FROM {column} - {NOW}) * 1000000)::int8")
}

impl PostgresStore {
    fn list_sql(&self) -> String {
        // Pages walk the primary key (collated "C", so byte order).
        format!(
            "SELECT token, fingerprint, state, payload, {}, {}, key FROM {} \
             WHERE state = $1 AND retain_until > {NOW} AND key > $2 \
             ORDER BY key LIMIT $3",
            left("lease_until"),
            left("retain_until"),
            self.sql.name.quoted()
        )
    }

    fn stats_sql(&self) -> String {
        let live = format!("retain_until > {NOW}");
        format!(
            "SELECT \
             count(*) FILTER (WHERE {live} AND state = 0 AND lease_until > {NOW}), \
             count(*) FILTER (WHERE {live} AND state = 0 \
                 AND (lease_until IS NULL OR lease_until <= {NOW})), \
             count(*) FILTER (WHERE {live} AND state = 1), \
             count(*) FILTER (WHERE {live} AND state = 2), \
             count(*) FILTER (WHERE retain_until <= {NOW}) \
             FROM {}",
            self.sql.name.quoted()
        )
    }
}

#[async_trait]
impl Inspect for PostgresStore {
    async fn list(
        &self,
        listing: Listing,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let limit = page_limit(limit);
        let rows = sqlx::query(&self.list_sql())
            .bind(i16::from(listing.state().as_u8()))
            .bind(after.unwrap_or(""))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(error)?;
        let records = rows
            .iter()
            .map(|row| {
                Ok(Listed {
                    key: row.try_get(6).map_err(error)?,
                    record: record(row, 0)?,
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
