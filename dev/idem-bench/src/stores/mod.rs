//! One module per store: its rows, its server's counters, its cleanup.
//!
//! The stores come from `idem-stores`' one list ([`StoreKind`]); each
//! needs a module here because only the store can write the raw baseline
//! it is measured against. A store of the list without one is reported as
//! skipped, not silently left out.

use std::path::Path;

use idem_stores::StoreKind;

use crate::bench::Bench;
use crate::fixture::BoxError;

pub(crate) mod memory;
pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod redis;
pub(crate) mod sql;
pub(crate) mod sql_bench;
pub(crate) mod sqlite;
pub(crate) mod target;

/// Where the stores are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Places<'a> {
    pub(crate) redis_url: &'a str,
    pub(crate) postgres_url: &'a str,
    pub(crate) mysql_url: &'a str,
    pub(crate) sqlite_dir: Option<&'a Path>,
    /// Memory-mapped I/O for the SQLite stores, if asked for.
    pub(crate) sqlite_mmap: Option<u64>,
    /// Open PostgreSQL stores with notifications on (the wake binary's
    /// woken rows); off, as in the store, elsewhere.
    pub(crate) postgres_notifications: bool,
}

/// A store's bench, or why its rows are skipped.
pub(crate) enum Opened {
    /// Ready to measure.
    Bench(Box<dyn Bench>),
    /// Its server (at the URL) did not answer, or it has no bench module.
    Skipped(String, BoxError),
}

/// Opens `kind`'s bench on a table or prefix named after `tag`.
pub(crate) async fn open(
    kind: StoreKind,
    places: Places<'_>,
    tag: &str,
) -> Result<Opened, BoxError> {
    fn server<B: Bench + 'static>(url: &str, bench: Result<B, BoxError>) -> Opened {
        match bench {
            Ok(bench) => Opened::Bench(Box::new(bench)),
            Err(reason) => Opened::Skipped(url.to_owned(), reason),
        }
    }
    Ok(match kind {
        StoreKind::Memory => Opened::Bench(Box::new(memory::MemoryBench)),
        StoreKind::Sqlite => Opened::Bench(Box::new(
            sqlite::SqliteBench::open(places.sqlite_dir, places.sqlite_mmap, tag).await?,
        )),
        StoreKind::Redis => server(
            places.redis_url,
            redis::RedisBench::connect(places.redis_url, tag).await,
        ),
        StoreKind::Postgres => server(
            places.postgres_url,
            postgres::PostgresBench::connect(places.postgres_url, tag).await,
        ),
        StoreKind::MySql => server(
            places.mysql_url,
            mysql::MySqlBench::connect(places.mysql_url, tag).await,
        ),
        other => Opened::Skipped(
            other.name().to_owned(),
            "no bench module writes its raw baseline yet".into(),
        ),
    })
}
