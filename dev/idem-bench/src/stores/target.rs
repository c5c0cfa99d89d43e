//! A store on a table, prefix or file of its own, for the binaries that
//! use it through `Store` alone: the scale binary fills it in bulk in the
//! store's own record format, weighs its records and reads what its
//! maintenance leaves behind after churn; the wake binary times waiters on
//! it. Each store's [`Target`] lives in its module beside its bench.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Store, Token};
use idem_stores::StoreKind;
use tokio::task::JoinSet;

use crate::fixture::BoxError;
use crate::stores::{memory, mysql, postgres, redis, sqlite, Places};

/// How long bulk records are kept: far beyond any run, as a service with
/// the default retention keeps its records, and short enough that a run
/// killed before its cleanup leaves nothing for long.
pub(crate) const BULK_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// How long to wait for a server before calling it unreachable.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows one bulk statement inserts: bounded, so that no transaction grows
/// with the target size.
pub(crate) const SQL_CHUNK: u64 = 250_000;

/// What the store's records take, and how that was measured.
#[derive(Debug, Clone)]
pub(crate) struct Footprint {
    /// Bytes the records take.
    pub(crate) bytes: u64,
    /// How they were counted.
    pub(crate) how: String,
}

/// A store opened on a table, prefix or file of its own, as the scale
/// binary fills, weighs and churns it and the wake binary times it.
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
    /// Ready.
    Target(Box<dyn Target>),
    /// Its server (at the URL) did not answer, or it has no module here.
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
        StoreKind::Memory => Opened::Target(Box::new(memory::MemoryTarget::new())),
        StoreKind::Sqlite => Opened::Target(Box::new(
            sqlite::SqliteTarget::open(places.sqlite_dir, places.sqlite_mmap, tag).await?,
        )),
        StoreKind::Redis => server(
            places.redis_url,
            redis::RedisTarget::connect(places.redis_url, tag).await,
        ),
        StoreKind::Postgres => server(
            places.postgres_url,
            postgres::PostgresTarget::connect(places.postgres_url, tag, |store| {
                store.with_notifications(places.postgres_notifications)
            })
            .await,
        ),
        StoreKind::MySql => server(
            places.mysql_url,
            mysql::MySqlTarget::connect(places.mysql_url, tag, |store| store).await,
        ),
        other => Opened::Skipped(
            other.name().to_owned(),
            "no bench module fills it in bulk yet".into(),
        ),
    })
}

/// Inserts the bulk records one `insert` each, from `callers` concurrent callers:
/// for the stores without a server-side bulk path (memory, whose inserts
/// are in-process, and Redis, whose client pipelines concurrent commands
/// on its one connection).
pub(crate) async fn fill_through_store(
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
