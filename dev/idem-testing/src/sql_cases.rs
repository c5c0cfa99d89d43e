//! Cases every SQL store's own tests run the same way: `connect` and its
//! typed failures, pools shared with the application, concurrent
//! migrations, connections killed while idle, table names, missing tables,
//! rows that do not decode. The PostgreSQL and MariaDB suites (and the next
//! SQL store's) implement [`SqlStore`] for a marker type and call these;
//! what differs between them (the SQL that plants a row, how a connection
//! is killed, lock queues and snapshots) stays in their own files.

use std::future::Future;
use std::time::Duration;

use idem_core::store::{Store, StoreError, StoreErrorKind};
use idem_core::{Error, Idempotent, When};
use sqlx::pool::PoolOptions;
use sqlx::{Database, Pool};

use crate::{unique_name, Cleanup, Server};

/// A SQL store as the shared cases drive it, named by a marker type in the
/// store's tests.
pub trait SqlStore: Send + Sync + 'static {
    /// The store.
    type Store: Store + Clone + 'static;
    /// Its sqlx database.
    type Db: Database;

    /// The server it needs.
    const SERVER: Server;
    /// Its name in store errors ([`StoreError::backend_name`]).
    const BACKEND: &'static str;
    /// The character that quotes an identifier in its SQL.
    const QUOTE: char;
    /// The longest table name it accepts.
    const LONGEST_NAME: usize;

    /// The store's `connect`.
    fn connect(url: &str) -> impl Future<Output = Result<Self::Store, StoreError>> + Send;

    /// The store's `from_pool`.
    fn from_pool(pool: Pool<Self::Db>) -> Self::Store;

    /// The store's `with_table`.
    fn with_table(store: Self::Store, table: &str) -> Result<Self::Store, StoreError>;

    /// The store's `table`.
    fn table(store: &Self::Store) -> String;

    /// The store's `migrate`.
    fn migrate(store: &Self::Store) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Runs `sql` on `pool` and returns the rows it changed.
    fn run(pool: &Pool<Self::Db>, sql: String) -> impl Future<Output = u64> + Send;

    /// The one number `sql` (a `SELECT count(*) …`) answers on `pool`.
    fn count(pool: &Pool<Self::Db>, sql: String) -> impl Future<Output = i64> + Send;

    /// The server under test's URL.
    fn url() -> String {
        Self::SERVER.url()
    }

    /// Runs `statement` on the server under test when dropped.
    fn cleanup(statement: String) -> Cleanup {
        match Self::SERVER {
            Server::MySql => Cleanup::mysql(&Self::url(), statement),
            _ => Cleanup::postgres(&Self::url(), statement),
        }
    }

    /// Drops `table` on the server under test when dropped.
    fn drop_table(table: &str) -> Cleanup {
        Self::cleanup(format!("DROP TABLE IF EXISTS {table}"))
    }

    /// A pool of up to `size` connections, or `None` to skip (see
    /// [`sql_pool`](crate::sql_pool)).
    fn pool(size: u32) -> impl Future<Output = Option<Pool<Self::Db>>> + Send {
        async move { crate::sql_pool(Self::SERVER, &Self::url(), size).await }
    }

    /// A store on a fresh, migrated table of its own in `pool`, and the
    /// guard that drops the table.
    fn store_in(pool: Pool<Self::Db>) -> impl Future<Output = (Self::Store, Cleanup)> + Send {
        async move {
            let table = unique_name("idem_test");
            let store = Self::with_table(Self::from_pool(pool), &table)
                .expect("a generated table name is valid");
            let guard = Self::drop_table(&table);
            Self::migrate(&store).await.expect("migrate");
            (store, guard)
        }
    }
}

/// Runs work answering `value` once under a key of `store`.
async fn runs_on<S: SqlStore>(store: S::Store, value: u8) {
    let ran: u8 = Idempotent::new(store)
        .execute("k", &(), || async move { Ok::<_, String>(value) })
        .await
        .unwrap();
    assert_eq!(ran, value);
}

/// `connect` opens a working pool; a malformed URL is a config error and a
/// closed port a backend error.
pub async fn connect_opens_a_pool_and_types_its_failures<S: SqlStore>() {
    let Some(_) = S::pool(1).await else {
        return;
    };
    let store = S::connect(&S::url()).await.unwrap();
    let table = unique_name("idem_connect");
    let _guard = S::drop_table(&table);
    let store = S::with_table(store, &table).unwrap();
    S::migrate(&store).await.unwrap();
    runs_on::<S>(store, 3).await;

    let default = S::SERVER.default_url();
    let scheme = &default[..default.find("://").unwrap()];
    let malformed = S::connect(&format!("{scheme}://[::1")).await.err().unwrap();
    assert_eq!(malformed.kind(), StoreErrorKind::Config, "{malformed}");
    let pool = PoolOptions::<S::Db>::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy(&format!("{scheme}://root@127.0.0.1:1/test"))
        .unwrap();
    let closed = S::from_pool(pool).load("k").await.unwrap_err();
    assert_eq!(closed.kind(), StoreErrorKind::Backend, "{closed}");
}

/// The store holds a connection only for one statement, so work that uses
/// the same one-connection pool runs without deadlock.
pub async fn a_pool_shared_with_the_application_works<S: SqlStore>() {
    let Some(pool) = S::pool(1).await else {
        return;
    };
    let (store, _guard) = S::store_in(pool.clone()).await;
    let app_table = unique_name("idem_app");
    S::run(&pool, format!("CREATE TABLE {app_table} (id int)")).await;
    let _app_guard = S::drop_table(&app_table);
    let idem = Idempotent::new(store);
    for _ in 0..3 {
        let pool = pool.clone();
        let insert = format!("INSERT INTO {app_table} VALUES (1)");
        let rows: u64 = idem
            .execute("order-1", &"body", || async move {
                Ok::<_, String>(S::run(&pool, insert).await)
            })
            .await
            .unwrap();
        assert_eq!(rows, 1);
    }
    let count = S::count(&pool, format!("SELECT count(*) FROM {app_table}")).await;
    assert_eq!(count, 1, "the work ran once for three calls");
}

/// Many processes migrating the same new table at once all succeed.
pub async fn concurrent_migrations_of_one_table_all_succeed<S: SqlStore>() {
    let Some(pool) = S::pool(2).await else {
        return;
    };
    for round in 0..3 {
        let table = unique_name("idem_migrate");
        let _guard = S::drop_table(&table);
        // Separate one-connection pools stand in for separate processes.
        let mut migrations = Vec::new();
        for _ in 0..12 {
            let own = PoolOptions::<S::Db>::new()
                .max_connections(1)
                .connect(&S::url())
                .await
                .unwrap();
            let store = S::with_table(S::from_pool(own), &table).unwrap();
            migrations.push(tokio::spawn(async move { S::migrate(&store).await }));
        }
        for migration in migrations {
            migration
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        runs_on::<S>(
            S::with_table(S::from_pool(pool.clone()), &table).unwrap(),
            round,
        )
        .await;
    }
}

/// Connections killed while idle, even while the work runs (`kill` kills
/// every connection of `store`'s pool), are replaced without an error
/// reaching the caller, and the outcome replays.
pub async fn connections_killed_while_idle_are_replaced<S, K, Fut>(store: S::Store, kill: K)
where
    S: SqlStore,
    K: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let idem = Idempotent::new(store);
    for round in 0..3_u8 {
        let kill = kill.clone();
        let ran: u8 = idem
            .execute(&format!("k{round}"), &(), || async move {
                kill().await;
                Ok::<_, String>(round)
            })
            .await
            .unwrap();
        assert_eq!(ran, round);
        let replayed: u8 = idem
            .execute(&format!("k{round}"), &(), || async { Ok::<_, String>(99) })
            .await
            .unwrap();
        assert_eq!(replayed, round);
    }
}

/// The kind of the store error `outcome` must be, checked to come before
/// the work and to name `S`'s backend.
pub fn store_kind<S: SqlStore, T: std::fmt::Debug>(
    outcome: Result<T, Error<String>>,
) -> StoreErrorKind {
    match outcome {
        Err(Error::Store { source, when }) => {
            assert_eq!(when, When::BeforeWork);
            assert_eq!(source.backend_name(), S::BACKEND);
            eprintln!("{source}");
            source.kind()
        }
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// Names that are not plain identifiers are refused before any SQL runs;
/// the longest plain one is kept as given.
pub fn table_names_that_are_not_plain_identifiers_are_refused<S: SqlStore>(pool: Pool<S::Db>) {
    let long = "t".repeat(S::LONGEST_NAME + 1);
    let quoted = format!("{q}x{q}", q = S::QUOTE);
    for name in [
        "x; drop table y",
        "",
        quoted.as_str(),
        "x'y",
        "a.b.c",
        "a b",
        "1x",
        long.as_str(),
    ] {
        let refused = S::with_table(S::from_pool(pool.clone()), name)
            .err()
            .unwrap();
        assert_eq!(refused.kind(), StoreErrorKind::Config, "{name:?}");
        assert!(
            refused.to_string().contains("invalid table name"),
            "{refused}"
        );
    }
    let longest = "t".repeat(S::LONGEST_NAME);
    let store = S::with_table(S::from_pool(pool), &longest).unwrap();
    assert_eq!(S::table(&store), longest);
}

/// A table in `namespace` (a schema or database the caller made), named
/// with mixed case and a reserved word, works as given, and migrating
/// twice is harmless.
pub async fn qualified_and_reserved_names_work<S: SqlStore>(pool: Pool<S::Db>, namespace: &str) {
    let store = S::with_table(S::from_pool(pool.clone()), &format!("{namespace}.Order")).unwrap();
    S::migrate(&store).await.unwrap();
    S::migrate(&store).await.unwrap();
    let idem = Idempotent::new(store);
    let ran: u8 = idem
        .execute("k", &(), || async { Ok::<_, String>(1) })
        .await
        .unwrap();
    let replayed: u8 = idem
        .execute("k", &(), || async { Ok::<_, String>(2) })
        .await
        .unwrap();
    assert_eq!((ran, replayed), (1, 1));
    let q = S::QUOTE;
    let rows = S::count(
        &pool,
        format!("SELECT count(*) FROM {namespace}.{q}Order{q}"),
    )
    .await;
    assert_eq!(rows, 1);
}

/// A store on each of `tables` (never migrated, or in a database that does
/// not exist) is a config error, before the work runs.
pub async fn missing_tables_are_config_errors<S: SqlStore>(pool: Pool<S::Db>, tables: &[String]) {
    for name in tables {
        let store = S::with_table(S::from_pool(pool.clone()), name).unwrap();
        let outcome = Idempotent::new(store)
            .execute("k", &(), || async { Ok::<u8, String>(1) })
            .await;
        assert_eq!(
            store_kind::<S, _>(outcome),
            StoreErrorKind::Config,
            "{name}"
        );
    }
}

/// A row planted as the store would never write it: a bad token, a bad
/// fingerprint or an unknown state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    /// The client key it is planted under.
    pub client_key: &'static str,
    /// Its token.
    pub token: Vec<u8>,
    /// Its fingerprint.
    pub fingerprint: Vec<u8>,
    /// Its state.
    pub state: i8,
}

/// Rows with a short token, a short fingerprint or an unknown state, each
/// with a payload of `x` and no lease.
pub fn bad_rows() -> Vec<BadRow> {
    let token = vec![7_u8; 16];
    let fingerprint = idem_core::Fingerprint::of_json(&())
        .unwrap()
        .as_bytes()
        .to_vec();
    let row = |client_key, token: &[u8], fingerprint: &[u8], state| BadRow {
        client_key,
        token: token.to_vec(),
        fingerprint: fingerprint.to_vec(),
        state,
    };
    vec![
        row("short-token", &[1, 2, 3], &fingerprint, 1),
        row("short-fingerprint", &token, &[9; 5], 1),
        row("bad-state", &token, &fingerprint, 9),
        row("negative-state", &token, &fingerprint, -1),
    ]
}

/// Each of [`bad_rows`], planted by `plant` under its storage key, is a
/// corrupt error from every reading method, the claim included; nothing
/// panics. `kept` then checks what must still hold of the row (that it is
/// left as it was, say).
pub async fn rows_that_do_not_decode_are_corrupt_errors<S, P, PF, K, KF>(
    store: &S::Store,
    plant: P,
    kept: K,
) where
    S: SqlStore,
    P: Fn(String, BadRow) -> PF,
    PF: Future<Output = ()>,
    K: Fn(String, BadRow) -> KF,
    KF: Future<Output = ()>,
{
    let idem = Idempotent::new(store.clone());
    for row in bad_rows() {
        let client_key = row.client_key;
        let key = idem.key(client_key).unwrap();
        plant(key.as_str().to_owned(), row.clone()).await;
        let outcome = idem
            .execute(client_key, &(), || async { Ok::<u8, String>(1) })
            .await;
        assert_eq!(
            store_kind::<S, _>(outcome),
            StoreErrorKind::Corrupt,
            "{client_key}"
        );
        let loaded = store.load(key.as_str()).await.unwrap_err();
        assert_eq!(loaded.kind(), StoreErrorKind::Corrupt, "{client_key}");
        assert!(loaded.to_string().contains("does not decode"), "{loaded}");
        kept(key.as_str().to_owned(), row).await;
    }
}

/// A stored outcome that is valid as a row but not as the caller's type is
/// a decode error, not a wrong replay.
pub async fn outcomes_of_another_type_are_decode_errors(store: impl Store) {
    let idem = Idempotent::new(store);
    let _: String = idem
        .execute("k", &(), || async { Ok::<_, String>("text".into()) })
        .await
        .unwrap();
    let replay = idem
        .execute("k", &(), || async { Ok::<u64, String>(1) })
        .await;
    assert!(matches!(replay, Err(Error::Decode(_))), "{replay:?}");
}
