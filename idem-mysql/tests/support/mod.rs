//! What the test binaries share: finding the server, unique tables, and
//! guards that drop them.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_mysql::sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions};
use idem_mysql::sqlx::Connection;
use idem_mysql::MySqlStore;

/// The server under test: `IDEM_MYSQL_URL`, or the local one.
pub fn url() -> String {
    std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A pool of up to `size` connections to `url`, or `None` (with the reason
/// printed) when the server cannot be reached. Under `CI` an unreachable
/// server fails the test instead.
pub async fn pool_at(url: &str, size: u32) -> Option<MySqlPool> {
    // One direct attempt first: a pool retries a refused connection until
    // its acquire timeout, which would make skipping slow.
    let probe = match MySqlConnection::connect(url).await {
        Ok(conn) => conn.close().await,
        Err(error) => Err(error),
    };
    let connected = match probe {
        Ok(()) => {
            MySqlPoolOptions::new()
                .max_connections(size)
                .acquire_timeout(Duration::from_secs(30))
                .connect(url)
                .await
        }
        Err(error) => Err(error),
    };
    match connected {
        Ok(pool) => Some(pool),
        Err(error) if std::env::var_os("CI").is_some() => {
            panic!("MariaDB at {url} is unreachable and CI is set: {error}")
        }
        Err(error) => {
            eprintln!("skipped: MariaDB at {url} is unreachable ({error}); set IDEM_MYSQL_URL");
            None
        }
    }
}

/// A pool on the server under test.
pub async fn pool(size: u32) -> Option<MySqlPool> {
    pool_at(&url(), size).await
}

/// A name no other fixture, test or process uses, with `prefix`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Drops a table (or a database) when dropped, over a connection of its
/// own on a thread of its own: `Drop` cannot await, and blocking on the
/// test's runtime or its pool from inside that runtime would deadlock.
#[derive(Debug)]
pub struct DropGuard {
    url: String,
    statement: String,
}

impl DropGuard {
    /// Runs `statement` on the server under test when dropped.
    pub fn new(statement: String) -> DropGuard {
        DropGuard {
            url: url(),
            statement,
        }
    }

    pub fn table(table: &str) -> DropGuard {
        DropGuard::new(format!("DROP TABLE IF EXISTS {table}"))
    }

    pub fn database(database: &str) -> DropGuard {
        DropGuard::new(format!("DROP DATABASE IF EXISTS {database}"))
    }
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        let url = self.url.clone();
        let statement = self.statement.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut conn = MySqlConnection::connect(&url).await?;
                idem_mysql::sqlx::raw_sql("SET SESSION lock_wait_timeout = 10")
                    .execute(&mut conn)
                    .await?;
                idem_mysql::sqlx::raw_sql(&statement)
                    .execute(&mut conn)
                    .await?;
                conn.close().await
            })?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("cleanup `{}` failed: {error}", self.statement),
            Err(_) => eprintln!("cleanup `{}` panicked", self.statement),
        }
    }
}

/// A store on a fresh, migrated table of its own in `pool`, and the guard
/// that drops the table.
pub async fn store_in(pool: MySqlPool) -> (MySqlStore, DropGuard) {
    let table = unique_name("idem_test");
    let store = MySqlStore::from_pool(pool)
        .with_table(&table)
        .expect("a generated table name is valid");
    let guard = DropGuard::table(&table);
    store.migrate().await.expect("migrate");
    (store, guard)
}

/// A store on a fresh table with a pool of its own, or `None` to skip.
pub async fn store() -> Option<(MySqlStore, DropGuard)> {
    Some(store_in(pool(8).await?).await)
}
