//! `PostgresStore`: construction, migration and the `Store` primitives.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{
    Insert, NewRecord, Record, Reset, State, Store, StoreError, Token, Wakeups,
};
use sqlx::postgres::{PgArguments, PgPool, PgQueryResult, Postgres};
use sqlx::query::Query;
use sqlx::Row;

use crate::error::error;
use crate::notify::Listener;
use crate::row::{interval, record};
use crate::schema::{Statements, TableName};

/// Idempotency records in one PostgreSQL table, on a sqlx pool.
///
/// Every method is one statement, so one round trip, and runs in its own
/// implicit transaction; deadlines are computed and compared on the
/// database's clock. Cheap to clone: clones share the pool.
///
/// # Setting up
///
/// Build it with [`connect`](PostgresStore::connect) or, to share the
/// application's pool, [`from_pool`](PostgresStore::from_pool); pick the
/// table with [`with_table`](PostgresStore::with_table) (default
/// [`DEFAULT_TABLE`](crate::DEFAULT_TABLE)) and create it with [`migrate`](PostgresStore::migrate)
/// at start-up.
///
/// # Purging
///
/// Records past retention behave as absent at once, but their rows stay
/// until [`purge_expired`](Store::purge_expired) deletes them. Call it
/// periodically in batches (see the [crate docs](crate#purging-expired-records));
/// a batch locks only the rows it deletes and skips rows other purgers
/// hold, so every app server may run its own purger.
///
/// # Isolation
///
/// The statements rely on PostgreSQL's default `READ COMMITTED` isolation.
/// Under a stricter `default_transaction_isolation`, two racing claims of
/// one key may fail with a serialization error, returned as a backend
/// [`StoreError`]; the claim is then safe to retry.
///
/// # Waking waiters
///
/// Off by default. With
/// [`with_notifications(true)`](PostgresStore::with_notifications),
/// recording an outcome or releasing a key also `NOTIFY`s the key on the
/// table's channel ([`notify_channel`](PostgresStore::notify_channel)), in
/// the same statement (in the caller's transaction for
/// [`complete_in`](PostgresStore::complete_in)), so it is sent when the
/// change commits, and the first waiter
/// ([`Idempotent::with_wait`](idem_core::Idempotent::with_wait)) starts one
/// listener connection, taken from the pool and kept, shared by every
/// waiter of the store and its clones; it reconnects when lost, and
/// waiters poll meanwhile. It is off by default because a transaction that
/// notified takes a database-wide lock at commit, which serializes the
/// commits of all completions: in the release bench, first executions at
/// 32 callers fell to 0.28–0.42× the raw protocol with it on, against
/// about 1.0× without
/// (`dev/idem-bench/notes/2026-11-30-transactional-rows.md`). Turn it on
/// where callers wait often and completions are few; leave it off behind
/// a transaction-pooling proxy such as PgBouncer in transaction mode,
/// where `LISTEN` receives nothing. Off, waiters poll (5 ms doubling to
/// 250 ms).
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) pool: PgPool,
    pub(crate) sql: Arc<Statements>,
    listener: Arc<Listener>,
    timeout: Duration,
}

/// How long one of the store's statements may take by default, the wait
/// for a connection included.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.sql.name.display())
            .field("pool", &self.pool)
            .finish()
    }
}

impl PostgresStore {
    /// Connects a new pool to `url` (for example
    /// `postgres://app@db.internal/app`) with sqlx's default pool options,
    /// and checks that one connection can be made.
    ///
    /// A malformed URL is a config error; an unreachable server a backend
    /// error. Like every acquisition from a sqlx pool, it keeps retrying a
    /// refused connection (a server that is starting) until the pool's
    /// acquire timeout, 30 s by default. To tune the pool (size, timeouts),
    /// build it yourself and use [`from_pool`](PostgresStore::from_pool).
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let pool = PgPool::connect(url).await.map_err(error)?;
        Ok(PostgresStore::from_pool(pool))
    }

    /// Uses `pool`, which may be shared with the rest of the application:
    /// the store takes a connection only for the length of one statement,
    /// so work that uses the same pool cannot deadlock against it.
    ///
    /// sqlx pools ping a connection before handing it out unless built
    /// with `test_before_acquire(false)`. The ping replaces connections the
    /// server dropped while they were idle (a restart) without an error
    /// reaching any caller; turning it off saves one network exchange per
    /// operation, and then each dropped connection fails one operation with
    /// a backend error before the pool replaces it.
    pub fn from_pool(pool: PgPool) -> PostgresStore {
        PostgresStore {
            pool,
            sql: Arc::new(Statements::new(TableName::default(), false)),
            listener: Arc::default(),
            timeout: DEFAULT_STATEMENT_TIMEOUT,
        }
    }

    /// Bounds each of the store's own statements, the wait for a pool
    /// connection included, to `timeout` (default
    /// [`DEFAULT_STATEMENT_TIMEOUT`], 10 s). A statement that takes longer
    /// fails with a backend error (its call's `When` says whether the work
    /// ran; the statement itself may or may not have been applied) and its
    /// connection is closed, not given back to the pool: on a half-open
    /// connection (requests arrive, no answer comes back) the call would
    /// otherwise wait forever, and the pool's own check of a returned
    /// connection would hold its place forever. Keep it above the longest
    /// a claim may wait on a row lock, which a transaction completing the
    /// same key ([`complete_in`](PostgresStore::complete_in)) holds until
    /// it commits. Transactions you run ([`begin`](PostgresStore::begin))
    /// are yours to bound.
    pub fn with_statement_timeout(mut self, timeout: Duration) -> PostgresStore {
        self.timeout = timeout;
        self
    }

    /// Uses the table `name`: `table` or `schema.table`, each part an ASCII
    /// letter or `_` followed by ASCII letters, digits or `_`, the table part
    /// at most 52 characters. Any other name is a config error. The name is
    /// checked here once and every statement is built from it now; it is
    /// quoted, so its case is kept.
    pub fn with_table(self, name: &str) -> Result<PostgresStore, StoreError> {
        let name = TableName::parse(name)?;
        let notify = self.sql.channel.is_some();
        Ok(PostgresStore {
            pool: self.pool,
            sql: Arc::new(Statements::new(name, notify)),
            listener: Arc::default(),
            timeout: self.timeout,
        })
    }

    /// Turns waking waiters by `LISTEN`/`NOTIFY` on or off (the default;
    /// see [waking waiters](PostgresStore#waking-waiters) for the cost).
    /// Off, no statement notifies and no listener connection is made:
    /// waiters poll.
    pub fn with_notifications(self, on: bool) -> PostgresStore {
        PostgresStore {
            pool: self.pool,
            sql: Arc::new(Statements::new(self.sql.name.clone(), on)),
            listener: Arc::default(),
            timeout: self.timeout,
        }
    }

    /// The channel outcomes are notified on (`idem:` and the table name, or
    /// a hash of the name when it is long), or `None` when notifications
    /// are off.
    pub fn notify_channel(&self) -> Option<&str> {
        self.sql.channel.as_deref()
    }

    /// Creates the table and its index if they are missing; harmless when
    /// they exist. Safe to run from many processes at once: the creation
    /// runs under an advisory lock on the table's name, since two concurrent
    /// `CREATE TABLE IF NOT EXISTS` can still collide. Creates no schema: a
    /// schema named in the table must exist.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // One simple-protocol message is one implicit transaction: the lock
        // is held until the DDL commits, and an error rolls it all back
        // without leaving the connection inside a failed transaction.
        sqlx::raw_sql(&self.sql.migrate)
            .execute(&self.pool)
            .await
            .map_err(error)?;
        Ok(())
    }

    /// The pool this store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table name, as given to [`with_table`](PostgresStore::with_table).
    pub fn table(&self) -> String {
        self.sql.name.display()
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.sql
    }

    async fn write(
        &self,
        sql: &str,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let query = sqlx::query(sql).bind(key).bind(&expected.as_bytes()[..]);
        let done: PgQueryResult = idem_sql::bounded!(self.pool, self.timeout, |c| {
            bind_record(query, record).execute(c)
        })
        .map_err(error)?;
        Ok(done.rows_affected() == 1)
    }
}

/// Binds a record's columns, in the order every writing statement takes
/// them after its key (and expected token): token, fingerprint, state,
/// payload, lease, retention.
pub(crate) fn bind_record<'q>(
    query: Query<'q, Postgres, PgArguments>,
    record: &'q NewRecord<'q>,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(&record.token.as_bytes()[..])
        .bind(record.fingerprint.stored())
        .bind(i16::from(record.state.as_u8()))
        .bind(record.payload)
        .bind(record.lease.map(interval))
        .bind(interval(record.retention))
}

#[async_trait]
impl Store for PostgresStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let query = bind_record(sqlx::query(&self.sql.insert).bind(key), record);
        let row =
            idem_sql::bounded!(self.pool, self.timeout, |c| query.fetch_one(c)).map_err(error)?;
        let inserted: bool = row.try_get(0).map_err(error)?;
        if inserted {
            Ok(Insert::Inserted)
        } else {
            Ok(Insert::Found(crate::row::record(&row, 1)?))
        }
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        if record.state == State::InFlight {
            return self.write(&self.sql.swap, key, expected, record).await;
        }
        let query = sqlx::query(&self.sql.settle)
            .bind(key)
            .bind(&expected.as_bytes()[..]);
        let query = bind_record(query, record);
        let row =
            idem_sql::bounded!(self.pool, self.timeout, |c| query.fetch_one(c)).map_err(error)?;
        let changed: i64 = row.try_get(0).map_err(error)?;
        Ok(changed == 1)
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.write(&self.sql.take_over, key, expected, record).await
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let query = sqlx::query(&self.sql.remove)
            .bind(key)
            .bind(&expected.as_bytes()[..]);
        let row =
            idem_sql::bounded!(self.pool, self.timeout, |c| query.fetch_one(c)).map_err(error)?;
        let removed: i64 = row.try_get(0).map_err(error)?;
        Ok(removed == 1)
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let query = sqlx::query(&self.sql.load).bind(key);
        let row = idem_sql::bounded!(self.pool, self.timeout, |c| query.fetch_optional(c))
            .map_err(error)?;
        row.map(|row| record(&row, 0)).transpose()
    }

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        let query = sqlx::query(&self.sql.reset).bind(key);
        let row = idem_sql::bounded!(self.pool, self.timeout, |c| query.fetch_optional(c))
            .map_err(error)?;
        let Some(row) = row else {
            return Ok(Reset::Absent);
        };
        let code: i16 = row.try_get(0).map_err(error)?;
        let deleted: bool = row.try_get(1).map_err(error)?;
        let state = u8::try_from(code)
            .ok()
            .and_then(State::from_u8)
            .ok_or_else(|| {
                StoreError::corrupt(
                    crate::BACKEND,
                    format!(
                        "the record under {key:?} has state code {code}, which is no known state"
                    ),
                )
            })?;
        Ok(match (deleted, state) {
            (true, state) => Reset::Deleted(state),
            (false, State::InFlight) => Reset::InFlight,
            // Settled in the statement's snapshot but deleted by a
            // concurrent reset before this one reached it.
            (false, _) => Reset::Absent,
        })
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        if limit == 0 {
            return Ok(0);
        }
        let query = sqlx::query(&self.sql.purge).bind(i64::try_from(limit).unwrap_or(i64::MAX));
        let done =
            idem_sql::bounded!(self.pool, self.timeout, |c| query.execute(c)).map_err(error)?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        let channel = self.sql.channel.as_deref()?;
        Some(self.listener.wakeups(&self.pool, channel))
    }
}
