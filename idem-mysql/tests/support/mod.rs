//! What the test binaries share: finding the server, unique tables, and
//! guards that drop them.
#![allow(dead_code, unreachable_pub)]

use idem_testing::{Cleanup, Server};

use idem_core::store::StoreError;
use idem_mysql::sqlx::{self, mysql::MySqlPool};
use idem_mysql::MySqlStore;

/// The server under test: `IDEM_MYSQL_URL`, or the local one.
pub fn url() -> String {
    Server::MySql.url()
}

/// A pool of up to `size` connections to `url`, or `None` (with the reason
/// printed) when the server cannot be reached. Under `CI` an unreachable
/// server fails the test instead.
pub async fn pool_at(url: &str, size: u32) -> Option<MySqlPool> {
    idem_testing::sql_pool(Server::MySql, url, size).await
}

/// A pool on the server under test.
pub async fn pool(size: u32) -> Option<MySqlPool> {
    pool_at(&url(), size).await
}

pub use idem_testing::unique_name;

/// Guards that drop a table or a database on the server under test when
/// dropped (`idem_testing::Cleanup`s).
#[derive(Debug)]
pub struct DropGuard;

impl DropGuard {
    /// Runs `statement` on the server under test when dropped.
    pub fn statement(statement: String) -> Cleanup {
        Cleanup::mysql(&url(), statement)
    }

    /// Drops `table` when dropped.
    pub fn table(table: &str) -> Cleanup {
        DropGuard::statement(format!("DROP TABLE IF EXISTS {table}"))
    }

    /// Drops `database` when dropped.
    pub fn database(database: &str) -> Cleanup {
        DropGuard::statement(format!("DROP DATABASE IF EXISTS {database}"))
    }
}

/// A store on a fresh, migrated table of its own in `pool`, and the guard
/// that drops the table.
pub async fn store_in(pool: MySqlPool) -> (MySqlStore, Cleanup) {
    let table = unique_name("idem_test");
    let store = MySqlStore::from_pool(pool)
        .with_table(&table)
        .expect("a generated table name is valid");
    let guard = DropGuard::table(&table);
    store.migrate().await.expect("migrate");
    (store, guard)
}

/// A store on a fresh table with a pool of its own, or `None` to skip.
pub async fn store() -> Option<(MySqlStore, Cleanup)> {
    Some(store_in(pool(8).await?).await)
}

/// The MariaDB store, as `idem_testing::sql_cases` drives it.
#[derive(Debug)]
pub struct My;

impl idem_testing::sql_cases::SqlStore for My {
    type Store = MySqlStore;
    type Db = sqlx::MySql;

    const SERVER: Server = Server::MySql;
    const BACKEND: &'static str = "mysql";
    const QUOTE: char = '`';
    const LONGEST_NAME: usize = 64;

    async fn connect(url: &str) -> Result<MySqlStore, StoreError> {
        MySqlStore::connect(url).await
    }

    fn from_pool(pool: MySqlPool) -> MySqlStore {
        MySqlStore::from_pool(pool)
    }

    fn with_table(store: MySqlStore, table: &str) -> Result<MySqlStore, StoreError> {
        store.with_table(table)
    }

    fn table(store: &MySqlStore) -> String {
        store.table()
    }

    async fn migrate(store: &MySqlStore) -> Result<(), StoreError> {
        store.migrate().await
    }

    async fn run(pool: &MySqlPool, sql: String) -> u64 {
        let done = sqlx::raw_sql(&sql).execute(pool).await.unwrap();
        done.rows_affected()
    }

    async fn count(pool: &MySqlPool, sql: String) -> i64 {
        sqlx::query_scalar(&sql).fetch_one(pool).await.unwrap()
    }
}
