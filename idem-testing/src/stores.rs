//! Every store by name: the one place the bench, the demo, the fault tests
//! and the HTTP suites learn of a store.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use idem_core::{MemoryStore, Store, StoreError};

use crate::{unique_name, Cleanup, Server};

/// A store the workspace ships, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreKind {
    /// `MemoryStore`, in process.
    Memory,
    /// `SqliteStore`, on a file.
    Sqlite,
    /// `RedisStore`.
    Redis,
    /// `PostgresStore`.
    Postgres,
    /// `MySqlStore`, on MariaDB.
    MySql,
}

/// A fresh, isolated store and the guard that cleans up after it (a key
/// prefix, a table, a temporary file).
#[derive(Debug)]
pub struct Fresh {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Cleans up when dropped; keep it as long as the store.
    pub guard: Cleanup,
}

/// A name that is no store's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStore(pub String);

impl fmt::Display for UnknownStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown store {:?}; known: ", self.0)?;
        let names: Vec<_> = StoreKind::ALL.iter().map(|k| k.name()).collect();
        f.write_str(&names.join(", "))
    }
}

impl std::error::Error for UnknownStore {}

impl StoreKind {
    /// Every store, in the order reports list them.
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Memory,
        StoreKind::Sqlite,
        StoreKind::Redis,
        StoreKind::Postgres,
        StoreKind::MySql,
    ];

    /// Its short name: `memory`, `sqlite`, `redis`, `postgres`, `mysql`.
    pub const fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Redis => "redis",
            StoreKind::Postgres => "postgres",
            StoreKind::MySql => "mysql",
        }
    }

    /// The server it needs, if any.
    pub const fn server(self) -> Option<Server> {
        match self {
            StoreKind::Memory | StoreKind::Sqlite => None,
            StoreKind::Redis => Some(Server::Redis),
            StoreKind::Postgres => Some(Server::Postgres),
            StoreKind::MySql => Some(Server::MySql),
        }
    }

    /// The store a URL names by its scheme (`redis://`, `postgres://`,
    /// `sqlite:PATH`, `memory`), if any.
    pub fn of_url(url: &str) -> Option<StoreKind> {
        let scheme = url.split(':').next().unwrap_or("");
        match scheme {
            "memory" => Some(StoreKind::Memory),
            "sqlite" => Some(StoreKind::Sqlite),
            "redis" | "rediss" => Some(StoreKind::Redis),
            "postgres" | "postgresql" => Some(StoreKind::Postgres),
            "mysql" | "mariadb" => Some(StoreKind::MySql),
            _ => None,
        }
    }

    /// Opens the store at `url` (a URL of its server; a file path for
    /// SQLite, ignored for memory) with `name` isolating it: a key prefix
    /// or a table (created). Returns no guard: the caller owns `name`.
    pub async fn open(self, url: &str, name: &str) -> Result<Arc<dyn Store>, StoreError> {
        Ok(match self {
            StoreKind::Memory => Arc::new(MemoryStore::new()),
            StoreKind::Sqlite => Arc::new(idem_sqlite::SqliteStore::open(url).await?),
            StoreKind::Redis => Arc::new(
                idem_redis::RedisStore::connect(url)
                    .await?
                    .with_prefix(format!("{name}:")),
            ),
            StoreKind::Postgres => {
                let store = idem_postgres::PostgresStore::connect(url)
                    .await?
                    .with_table(name)?;
                store.migrate().await?;
                Arc::new(store)
            }
            StoreKind::MySql => {
                let store = idem_mysql::MySqlStore::connect(url)
                    .await?
                    .with_table(name)?;
                store.migrate().await?;
                Arc::new(store)
            }
        })
    }

    /// A fresh, isolated store: a temporary file, a new key prefix, a new
    /// table. `None` (after printing why) when its server is unreachable;
    /// a panic instead when `CI` is set.
    pub async fn fresh(self) -> Option<Fresh> {
        let name = unique_name("idem_test");
        let fresh = match self {
            StoreKind::Memory => Fresh {
                store: Arc::new(MemoryStore::new()),
                guard: Cleanup::none(),
            },
            StoreKind::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let path = dir.path().join("idem.db");
                let store = self.open(&path.display().to_string(), &name).await;
                Fresh {
                    store: store.expect("a new SQLite file opens"),
                    guard: Cleanup::holding(dir),
                }
            }
            StoreKind::Redis => {
                let url = Server::Redis.require()?;
                let guard = Cleanup::redis_prefix(&url, &format!("{name}:"));
                let store = self.open(&url, &name).await;
                Fresh {
                    store: store.unwrap_or_else(|e| panic!("Redis at {url}: {e}")),
                    guard,
                }
            }
            StoreKind::Postgres => {
                let url = Server::Postgres.require()?;
                let guard = Cleanup::postgres(&url, format!("DROP TABLE IF EXISTS {name}"));
                let store = self.open(&url, &name).await;
                Fresh {
                    store: store.unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e}")),
                    guard,
                }
            }
            StoreKind::MySql => {
                let url = Server::MySql.require()?;
                let guard = Cleanup::mysql(&url, format!("DROP TABLE IF EXISTS {name}"));
                let store = self.open(&url, &name).await;
                Fresh {
                    store: store.unwrap_or_else(|e| panic!("MariaDB at {url}: {e}")),
                    guard,
                }
            }
        };
        Some(fresh)
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StoreKind {
    type Err = UnknownStore;

    fn from_str(name: &str) -> Result<StoreKind, UnknownStore> {
        StoreKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| UnknownStore(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_urls_name_each_store_once() {
        for kind in StoreKind::ALL {
            assert_eq!(kind.name().parse::<StoreKind>(), Ok(kind));
        }
        assert!("mongo".parse::<StoreKind>().is_err());
        assert_eq!(
            StoreKind::of_url("postgresql://h/db"),
            Some(StoreKind::Postgres)
        );
        assert_eq!(
            StoreKind::of_url("mysql://root@h:3306/test"),
            Some(StoreKind::MySql)
        );
        assert_eq!(StoreKind::of_url("sqlite:a.db"), Some(StoreKind::Sqlite));
        assert_eq!(StoreKind::of_url("ftp://x"), None);
    }

    #[tokio::test]
    async fn every_fresh_store_runs_work_once_and_replays() {
        for kind in StoreKind::ALL {
            let Some(fresh) = kind.fresh().await else {
                continue;
            };
            let idem = idem_core::Idempotent::from_arc(fresh.store);
            let runs = std::sync::atomic::AtomicUsize::new(0);
            for _ in 0..2 {
                let n: u32 = idem
                    .execute("k", "b", || async {
                        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        Ok::<_, ()>(7)
                    })
                    .await
                    .unwrap();
                assert_eq!(n, 7, "{kind}");
            }
            assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "{kind}");
        }
    }
}
