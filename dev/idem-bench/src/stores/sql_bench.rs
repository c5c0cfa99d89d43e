//! The bench and the scale target both SQL stores share, written once over
//! [`Dialect`]: what differs between MariaDB and PostgreSQL (quoting, the
//! charges table, counters, bulk fill, sizes) stays in their modules.

use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::{Record, Store};
use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

use crate::bench::{Bench, Contestant, Counters};
use crate::fixture::BoxError;
use crate::report::Report;
use crate::stores::sql::SqlStore;
use crate::stores::target::{Footprint, Target};

/// What a SQL store says in its own words, for [`SqlBench`] and
/// [`SqlTarget`].
#[async_trait]
pub(crate) trait Dialect: SqlStore + Store + Sized {
    /// The store's name in the report.
    const NAME: &'static str;

    /// What the bench keeps beside the pool to read the server's counters.
    type Observer: Send + Sync;

    /// `name` quoted as an identifier.
    fn quote(name: &str) -> String;

    /// The statement that creates the business table `table` (quoted).
    fn charges_table(table: &str) -> String;

    /// The business insert into `table` (quoted): the key, then an amount.
    fn charge_insert(table: &str) -> String;

    /// Opens what reads the counters.
    async fn observer(url: &str) -> Result<Self::Observer, BoxError>;

    /// The server's counters now.
    async fn read_counters(&self, observer: &Self::Observer) -> Result<Counters, BoxError>;

    /// The bench's rows, with `insert` as the business write.
    fn contestants(&self, insert: String) -> Vec<Contestant>;

    /// [`Target::fill`] on `table` (quoted).
    async fn fill(
        &self,
        table: &str,
        prefix: &str,
        template: &str,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError>;

    /// [`Target::footprint`] of `table` (quoted).
    async fn footprint(&self, table: &str) -> Result<Footprint, BoxError>;

    /// [`Target::after_churn`] of `table` (quoted).
    async fn after_churn(&self, table: &str) -> Result<Vec<String>, BoxError>;
}

/// Every connection of `pool` it can take within 200 ms each: the
/// counters are per connection, so each must be read.
pub(crate) async fn hold_all<D: Database>(
    pool: &Pool<D>,
) -> Result<Vec<PoolConnection<D>>, sqlx::Error> {
    let mut held = Vec::new();
    for _ in 0..pool.size() {
        match tokio::time::timeout(std::time::Duration::from_millis(200), pool.acquire()).await {
            Ok(conn) => held.push(conn?),
            Err(_) => break,
        }
    }
    Ok(held)
}

/// The store opened on the table `idem_bench_{tag}`, `configure`d, then
/// migrated.
async fn open<S: Dialect>(
    url: &str,
    tag: &str,
    configure: impl FnOnce(S) -> S + Send,
) -> Result<S, BoxError> {
    let store = configure(S::open(url, &format!("idem_bench_{tag}")).await?);
    store.migrate().await?;
    Ok(store)
}

/// A SQL store's bench rows, their shared pool, and what reads the
/// counters.
pub(crate) struct SqlBench<S: Dialect> {
    store: S,
    observer: S::Observer,
}

impl<S: Dialect> std::fmt::Debug for SqlBench<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlBench")
            .field("store", &S::NAME)
            .field("table", &self.store.table())
            .finish_non_exhaustive()
    }
}

impl<S: Dialect> SqlBench<S> {
    /// Connects the store's pool (sqlx's defaults, as `connect` gives a
    /// user) and the counters' observer, and creates a table for this run.
    pub(crate) async fn connect(url: &str, tag: &str) -> Result<SqlBench<S>, BoxError> {
        let store: S = open(url, tag, |store| store).await?;
        let charges = S::quote(&format!("{}_charges", store.table()));
        store.raw(&S::charges_table(&charges)).await?;
        let observer = S::observer(url).await?;
        Ok(SqlBench { store, observer })
    }
}

#[async_trait]
impl<S: Dialect> Bench for SqlBench<S> {
    fn store(&self) -> &'static str {
        S::NAME
    }

    fn contestants(&self) -> Vec<Contestant> {
        let charges = S::quote(&format!("{}_charges", self.store.table()));
        self.store.contestants(S::charge_insert(&charges))
    }

    async fn tidy(&self) -> Result<(), BoxError> {
        Ok(())
    }

    async fn counters(&self) -> Result<Option<Counters>, BoxError> {
        // A server without the counters (PostgreSQL before 15 lacks the
        // statistics functions) gets no round-trip figures rather than no
        // benchmark.
        Ok(self.store.read_counters(&self.observer).await.ok())
    }

    async fn finish(&self, _report: &mut Report) -> Result<(), BoxError> {
        let table = self.store.table();
        // The name was built by this harness and validated by the store.
        self.store
            .raw(&format!(
                "DROP TABLE IF EXISTS {}, {}",
                S::quote(&table),
                S::quote(&format!("{table}_charges"))
            ))
            .await?;
        Ok(())
    }
}

/// A SQL store in its own table, filled in bulk by the server.
pub(crate) struct SqlTarget<S: Dialect> {
    store: Arc<S>,
}

impl<S: Dialect> SqlTarget<S> {
    /// Connects to `url` on the table `idem_bench_{tag}`, with the store's
    /// options set by `configure` before it migrates.
    pub(crate) async fn connect(
        url: &str,
        tag: &str,
        configure: impl FnOnce(S) -> S + Send,
    ) -> Result<SqlTarget<S>, BoxError> {
        Ok(SqlTarget {
            store: Arc::new(open(url, tag, configure).await?),
        })
    }

    /// The table's name as a quoted identifier (the store validated it).
    fn table(&self) -> String {
        S::quote(&self.store.table())
    }
}

#[async_trait]
impl<S: Dialect> Target for SqlTarget<S> {
    fn name(&self) -> &'static str {
        S::NAME
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
        self.store
            .fill(&self.table(), prefix, template, from, to)
            .await
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        self.store.footprint(&self.table()).await
    }

    async fn rows(&self) -> Result<Option<u64>, BoxError> {
        let n = self
            .store
            .scalar(&format!("SELECT count(*) FROM {}", self.table()))
            .await?;
        Ok(Some(n as u64))
    }

    async fn after_churn(&self) -> Result<Vec<String>, BoxError> {
        self.store.after_churn(&self.table()).await
    }

    async fn remove_all(&self) -> Result<(), BoxError> {
        self.store
            .raw(&format!("DROP TABLE IF EXISTS {}", self.table()))
            .await?;
        Ok(())
    }
}
