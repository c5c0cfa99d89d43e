//! What the test binaries share: finding the server, unique tables, and
//! guards that drop them.
#![allow(dead_code, unreachable_pub)]

use idem_testing::{Cleanup, Server};

use idem_core::store::StoreError;
use idem_postgres::sqlx::{self, postgres::PgPool};
use idem_postgres::PostgresStore;

/// The server under test: `IDEM_POSTGRES_URL`, or the local one.
pub fn url() -> String {
    Server::Postgres.url()
}

/// A pool of up to `size` connections to `url`, or `None` (with the reason
/// printed) when the server cannot be reached. Under `CI` an unreachable
/// server fails the test instead.
pub async fn pool_at(url: &str, size: u32) -> Option<PgPool> {
    idem_testing::sql_pool(Server::Postgres, url, size).await
}

/// A pool on the server under test.
pub async fn pool(size: u32) -> Option<PgPool> {
    pool_at(&url(), size).await
}

pub use idem_testing::unique_name;

/// Runs `statement` on the server under test when dropped.
pub fn drop_guard(statement: String) -> Cleanup {
    Cleanup::postgres(&url(), statement)
}

/// Drops `table` when dropped.
pub fn drop_table(table: &str) -> Cleanup {
    drop_guard(format!("DROP TABLE IF EXISTS {table}"))
}

/// Drops `database` when dropped.
pub fn drop_database(database: &str) -> Cleanup {
    drop_guard(format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
}

/// A store on a fresh, migrated table of its own in `pool`, and the guard
/// that drops the table.
pub async fn store_in(pool: PgPool) -> (PostgresStore, Cleanup) {
    let table = unique_name("idem_test");
    let store = PostgresStore::from_pool(pool)
        .with_table(&table)
        .expect("a generated table name is valid");
    let guard = drop_table(&table);
    store.migrate().await.expect("migrate");
    (store, guard)
}

/// A store on a fresh table with a pool of its own, or `None` to skip.
pub async fn store() -> Option<(PostgresStore, Cleanup)> {
    Some(store_in(pool(8).await?).await)
}

/// The PostgreSQL store, as `idem_testing::sql_cases` drives it.
#[derive(Debug)]
pub struct Pg;

impl idem_testing::sql_cases::SqlStore for Pg {
    type Store = PostgresStore;
    type Db = sqlx::Postgres;

    const SERVER: Server = Server::Postgres;
    const BACKEND: &'static str = "postgres";
    const QUOTE: char = '"';
    const LONGEST_NAME: usize = 52;

    async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        PostgresStore::connect(url).await
    }

    fn from_pool(pool: PgPool) -> PostgresStore {
        PostgresStore::from_pool(pool)
    }

    fn with_table(store: PostgresStore, table: &str) -> Result<PostgresStore, StoreError> {
        store.with_table(table)
    }

    fn table(store: &PostgresStore) -> String {
        store.table()
    }

    async fn migrate(store: &PostgresStore) -> Result<(), StoreError> {
        store.migrate().await
    }

    async fn run(pool: &PgPool, sql: String) -> u64 {
        let done = sqlx::raw_sql(&sql).execute(pool).await.unwrap();
        done.rows_affected()
    }

    async fn count(pool: &PgPool, sql: String) -> i64 {
        sqlx::query_scalar(&sql).fetch_one(pool).await.unwrap()
    }
}
