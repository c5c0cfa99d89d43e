//! Every store by name, for tests: `idem-stores`' one list
//! ([`StoreKind`]), with the server each needs and a fresh, isolated store
//! of each that cleans up after itself.

use std::future::Future;
use std::sync::Arc;

use idem_core::store::Store;
pub use idem_stores::{Isolation, StoreKind, StoreUrl, UnknownStore};

use crate::{unique_name, Cleanup, Server};

/// A fresh, isolated store and the guard that cleans up after it (a key
/// prefix, a table, a temporary file).
#[derive(Debug)]
pub struct Fresh {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Cleans up when dropped; keep it as long as the store.
    pub guard: Cleanup,
    /// Where it is: the server's URL, or the file's path.
    pub location: String,
    /// What isolates it: its key prefix (without the `:`) or table.
    pub name: String,
}

/// What tests need of a [`StoreKind`] beyond opening it. Derived from the
/// kind's URL schemes and [`Isolation`], so a new store needs no arm here.
pub trait TestStore: Copy {
    /// The server it needs, if any: the [`Server`] whose default URL names
    /// this store.
    fn server(self) -> Option<Server>;

    /// A fresh, isolated store: a temporary file, a new key prefix, a new
    /// table. `None` (after printing why) when its server is unreachable;
    /// a panic instead when `CI` is set.
    fn fresh(self) -> impl Future<Output = Option<Fresh>> + Send;
}

impl TestStore for StoreKind {
    fn server(self) -> Option<Server> {
        Server::ALL
            .into_iter()
            .find(|server| StoreKind::of_url(server.default_url()) == Some(self))
    }

    async fn fresh(self) -> Option<Fresh> {
        let name = unique_name("idem_test");
        let (location, guard) = match self.server() {
            Some(server) => {
                let url = server.require()?;
                let guard = server.cleanup(&url, self.isolation(), &name);
                (url, guard)
            }
            None if self.isolation() == Isolation::File => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let path = dir.path().join("idem.db").display().to_string();
                (path, Cleanup::holding(dir))
            }
            None => (String::new(), Cleanup::none()),
        };
        let store = self
            .open(&location, Some(&name))
            .await
            .unwrap_or_else(|e| panic!("{self} at {location}: {e}"));
        Some(Fresh {
            store,
            guard,
            location,
            name,
        })
    }
}

impl Server {
    /// Removes what a store isolated by `name` made on this server at
    /// `url`: the keys under `name:`, or the table `name`.
    pub fn cleanup(self, url: &str, isolation: Isolation, name: &str) -> Cleanup {
        let drop_table = format!("DROP TABLE IF EXISTS {name}");
        match (self, isolation) {
            (_, Isolation::Process | Isolation::File) => Cleanup::none(),
            (Server::Redis, _) => Cleanup::redis_prefix(url, &format!("{name}:")),
            (Server::Postgres, _) => Cleanup::postgres(url, drop_table),
            (Server::MySql, _) => Cleanup::mysql(url, drop_table),
            // Brokers hold no idem records.
            (Server::Nats | Server::Amqp | Server::Kafka, _) => Cleanup::none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_store_finds_its_server() {
        assert_eq!(StoreKind::Redis.server(), Some(Server::Redis));
        assert_eq!(StoreKind::Postgres.server(), Some(Server::Postgres));
        assert_eq!(StoreKind::MySql.server(), Some(Server::MySql));
        assert_eq!(StoreKind::Sqlite.server(), None);
        assert_eq!(StoreKind::Memory.server(), None);
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
