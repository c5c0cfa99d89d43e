//! The stores by name: the one list.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use idem_core::store::{Store, StoreError};
use idem_core::MemoryStore;

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
    /// `DynamoStore` (feature `dynamodb`). Not in [`StoreKind::ALL`]: the
    /// tools and tests that run every store need its emulator first.
    #[cfg(feature = "dynamodb")]
    DynamoDb,
}

/// What keeps one user's records apart from another's on the same
/// backend: what the `name` given to [`StoreKind::open`] becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Isolation {
    /// Nothing to name: each process has its own records.
    Process,
    /// The file: the location is a path, the name is not used.
    File,
    /// A key prefix, `name:`.
    KeyPrefix,
    /// A table, `name`, created by `open` if missing.
    Table,
}

/// A name or URL that is no store's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStore(pub String);

impl fmt::Display for UnknownStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown store {:?}; known: ", self.0)?;
        let forms: Vec<_> = StoreKind::ALL
            .iter()
            .chain(StoreKind::OPTIONAL)
            .map(|k| k.url_form())
            .collect();
        f.write_str(&forms.join(", "))
    }
}

impl std::error::Error for UnknownStore {}

impl StoreKind {
    /// Every store the tools and the test matrix run, in the order reports
    /// list them; [`StoreKind::OPTIONAL`] holds the others.
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Memory,
        StoreKind::Sqlite,
        StoreKind::Redis,
        StoreKind::Postgres,
        StoreKind::MySql,
    ];

    /// The stores behind a feature that are not in [`StoreKind::ALL`]:
    /// DynamoDB, with the `dynamodb` feature.
    #[cfg(feature = "dynamodb")]
    pub const OPTIONAL: &'static [StoreKind] = &[StoreKind::DynamoDb];
    /// The stores behind a feature that are not in [`StoreKind::ALL`]:
    /// DynamoDB, with the `dynamodb` feature.
    #[cfg(not(feature = "dynamodb"))]
    pub const OPTIONAL: &'static [StoreKind] = &[];

    /// Its short name: `memory`, `sqlite`, `redis`, `postgres`, `mysql`,
    /// `dynamodb`.
    pub const fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Redis => "redis",
            StoreKind::Postgres => "postgres",
            StoreKind::MySql => "mysql",
            #[cfg(feature = "dynamodb")]
            StoreKind::DynamoDb => "dynamodb",
        }
    }

    /// The URL schemes that name it, the first the usual one.
    pub const fn schemes(self) -> &'static [&'static str] {
        match self {
            StoreKind::Memory => &["memory"],
            StoreKind::Sqlite => &["sqlite"],
            StoreKind::Redis => &["redis", "rediss"],
            StoreKind::Postgres => &["postgres", "postgresql"],
            StoreKind::MySql => &["mysql", "mariadb"],
            #[cfg(feature = "dynamodb")]
            StoreKind::DynamoDb => &["dynamodb"],
        }
    }

    /// What isolates one user of it from another.
    pub const fn isolation(self) -> Isolation {
        match self {
            StoreKind::Memory => Isolation::Process,
            StoreKind::Sqlite => Isolation::File,
            StoreKind::Redis => Isolation::KeyPrefix,
            StoreKind::Postgres | StoreKind::MySql => Isolation::Table,
            #[cfg(feature = "dynamodb")]
            StoreKind::DynamoDb => Isolation::Table,
        }
    }

    /// The store a URL names by its scheme (`redis://…`, `postgres://…`,
    /// `sqlite:PATH`, `memory`), if any.
    pub fn of_url(url: &str) -> Option<StoreKind> {
        let scheme = url.split(':').next().unwrap_or("");
        StoreKind::ALL
            .iter()
            .chain(StoreKind::OPTIONAL)
            .copied()
            .find(|kind| kind.schemes().contains(&scheme))
    }

    /// Opens the store at `location` (its server's URL; a file path for
    /// SQLite; ignored for memory), isolated by `name` as its
    /// [`isolation`](StoreKind::isolation) says: a key prefix `name:` or a
    /// table `name`, created if missing. `None` is the store's default
    /// prefix or table.
    pub async fn open(
        self,
        location: &str,
        name: Option<&str>,
    ) -> Result<Arc<dyn Store>, StoreError> {
        Ok(match self {
            StoreKind::Memory => Arc::new(MemoryStore::new()),
            StoreKind::Sqlite => Arc::new(idem_sqlite::SqliteStore::open(location).await?),
            StoreKind::Redis => {
                let info = idem_redis::connection_info(location)?;
                let store = idem_redis::RedisStore::connect(info).await?;
                match name {
                    Some(name) => Arc::new(store.with_prefix(format!("{name}:"))),
                    None => Arc::new(store),
                }
            }
            StoreKind::Postgres => {
                let mut store = idem_postgres::PostgresStore::connect(location).await?;
                if let Some(name) = name {
                    store = store.with_table(name)?;
                }
                store.migrate().await?;
                Arc::new(store)
            }
            StoreKind::MySql => {
                let mut store = idem_mysql::MySqlStore::connect(location).await?;
                if let Some(name) = name {
                    store = store.with_table(name)?;
                }
                store.migrate().await?;
                Arc::new(store)
            }
            #[cfg(feature = "dynamodb")]
            StoreKind::DynamoDb => {
                let mut store = idem_dynamodb::DynamoStore::from_url(location)?;
                if let Some(name) = name {
                    // A table name allows `_`, `-` and `.`, not `:`.
                    store = store.with_table(name)?;
                }
                // As the SQL stores migrate: a missing table is created, a
                // ready one only read (`DescribeTable`), so a user without
                // rights to create tables opens one made for them.
                store.create_table().await?;
                store.check().await?;
                Arc::new(store)
            }
        })
    }

    /// How a URL of it looks, for messages: `sqlite:PATH`,
    /// `redis://HOST`, ….
    pub fn url_form(self) -> String {
        let scheme = self.schemes()[0];
        #[cfg(feature = "dynamodb")]
        if self == StoreKind::DynamoDb {
            return format!("{scheme}://TABLE?region=REGION");
        }
        match self.isolation() {
            Isolation::Process => scheme.to_owned(),
            Isolation::File => format!("{scheme}:PATH"),
            Isolation::KeyPrefix => format!("{scheme}://HOST"),
            Isolation::Table => format!("{scheme}://HOST/DB"),
        }
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StoreKind {
    type Err = UnknownStore;

    /// A store by its [`name`](StoreKind::name).
    fn from_str(name: &str) -> Result<StoreKind, UnknownStore> {
        StoreKind::ALL
            .iter()
            .chain(StoreKind::OPTIONAL)
            .copied()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| UnknownStore(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_schemes_name_each_store_once() {
        for kind in StoreKind::ALL {
            assert_eq!(kind.name().parse::<StoreKind>(), Ok(kind));
            for scheme in kind.schemes() {
                assert_eq!(StoreKind::of_url(&format!("{scheme}:x")), Some(kind));
            }
            let others = StoreKind::ALL.into_iter().filter(|k| *k != kind);
            for other in others {
                assert!(other.schemes().iter().all(|s| !kind.schemes().contains(s)));
            }
        }
        assert!("mongo".parse::<StoreKind>().is_err());
        assert_eq!(
            StoreKind::of_url("postgresql://h/db"),
            Some(StoreKind::Postgres)
        );
        assert_eq!(StoreKind::of_url("ftp://x"), None);
        let unknown = UnknownStore("ftp://x".into()).to_string();
        assert!(unknown.contains("sqlite:PATH") && unknown.contains("mysql://HOST/DB"));
    }

    #[cfg(feature = "dynamodb")]
    #[test]
    fn dynamodb_urls_name_the_dynamodb_store() {
        let kind = StoreKind::DynamoDb;
        assert_eq!(
            StoreKind::of_url("dynamodb://idem?region=eu-west-1"),
            Some(kind)
        );
        assert_eq!("dynamodb".parse::<StoreKind>(), Ok(kind));
        assert!(!StoreKind::ALL.contains(&kind));
        let unknown = UnknownStore("ftp://x".into()).to_string();
        assert!(
            unknown.contains("dynamodb://TABLE?region=REGION"),
            "{unknown}"
        );
    }
}
