//! [`Inspect`] for [`SqliteStore`]: listing and counting records, read on
//! the writer's connection like every other operation.

use async_trait::async_trait;
use idem_core::inspect::{page_limit, Inspect, Listed, Listing, Page, Stats};
use idem_core::store::StoreError;
use rusqlite::{params, Connection};

use crate::error::Failure;
use crate::ops::{decode, Done, Op, OpError};
use crate::store::unexpected;
use crate::SqliteStore;

// Pages walk the primary key, so each page is one index range scan.
const LIST: &str = "SELECT key, token, fingerprint, state, payload, lease_until, retain_until \
    FROM idem_records WHERE state = ?1 AND retain_until > ?2 AND key > ?3 \
    ORDER BY key LIMIT ?4";

const STATS: &str = "SELECT \
    count(*) FILTER (WHERE retain_until > ?1 AND state = 0 \
        AND lease_until IS NOT NULL AND lease_until > ?1), \
    count(*) FILTER (WHERE retain_until > ?1 AND state = 0 \
        AND (lease_until IS NULL OR lease_until <= ?1)), \
    count(*) FILTER (WHERE retain_until > ?1 AND state = 1), \
    count(*) FILTER (WHERE retain_until > ?1 AND state = 2), \
    count(*) FILTER (WHERE retain_until <= ?1) \
    FROM idem_records";

/// A read across records, as the writer thread runs it.
#[derive(Debug)]
pub(crate) enum Query {
    List {
        listing: Listing,
        after: Option<String>,
        limit: usize,
    },
    Stats,
}

impl Query {
    pub(crate) fn run(&self, conn: &Connection, now: i64) -> Result<Done, OpError> {
        match self {
            Query::List {
                listing,
                after,
                limit,
            } => {
                let mut statement = conn.prepare_cached(LIST)?;
                let state = listing.state().as_u8();
                let after = after.as_deref().unwrap_or("");
                let fetch = i64::try_from(*limit).unwrap_or(i64::MAX);
                let mut rows = statement.query(params![state, now, after, fetch])?;
                let mut records = Vec::new();
                while let Some(row) = rows.next()? {
                    let key: String = row.get(0)?;
                    // The columns after the key are the ones `load` reads,
                    // decoded by the same function.
                    let record = decode(&Shifted(row), now).map_err(|reason| {
                        OpError::Bad(Failure::BadRow(format!(
                            "the record under {key:?} {reason}"
                        )))
                    })?;
                    records.push(Listed { key, record });
                }
                let next = (records.len() == *limit)
                    .then(|| records.last().map(|last| last.key.clone()))
                    .flatten();
                Ok(Done::Page(Page { records, next }))
            }
            Query::Stats => {
                let counts = conn.prepare_cached(STATS)?.query_row([now], |row| {
                    Ok([
                        row.get(0)?,
                        row.get(1)?,
                        row.get(2)?,
                        row.get(3)?,
                        row.get(4)?,
                    ])
                })?;
                let [in_flight, lapsed, completed, failed, expired]: [i64; 5] = counts;
                let count = |n: i64| u64::try_from(n).unwrap_or(0);
                let mut stats = Stats::default();
                stats.in_flight = count(in_flight);
                stats.lapsed = count(lapsed);
                stats.completed = count(completed);
                stats.failed = count(failed);
                stats.expired = count(expired);
                Ok(Done::Stats(stats))
            }
        }
    }
}

/// A row read one column to the right, so that the key can come first.
pub(crate) struct Shifted<'a, 'b>(pub(crate) &'a rusqlite::Row<'b>);

impl crate::ops::Columns for Shifted<'_, '_> {
    fn column<T: rusqlite::types::FromSql>(&self, index: usize) -> rusqlite::Result<T> {
        self.0.get(index + 1)
    }
}

#[async_trait]
impl Inspect for SqliteStore {
    async fn list(
        &self,
        listing: Listing,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        let query = Query::List {
            listing,
            after: after.map(str::to_owned),
            limit: page_limit(limit),
        };
        match self.call(Op::Inspect(query)).await? {
            Done::Page(page) => Ok(page),
            other => Err(unexpected(other)),
        }
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        match self.call(Op::Inspect(Query::Stats)).await? {
            Done::Stats(stats) => Ok(stats),
            other => Err(unexpected(other)),
        }
    }
}
