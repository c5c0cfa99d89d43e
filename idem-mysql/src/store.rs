//! `MySqlStore`: construction, migration and the `Store` primitives.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token};
use sqlx::mysql::{MySql, MySqlArguments, MySqlPool};
use sqlx::query::Query;

use crate::error::{error, is_deadlock};
use crate::row::{micros, record};
use crate::schema::{Statements, TableName};

/// How many times a statement that lost a deadlock is run again before the
/// error reaches the caller. A deadlock victim is rolled back whole, so a
/// rerun is the same single atomic step, not a second one.
const DEADLOCK_RERUNS: usize = 8;

/// How many times a reset that found a settled row it did not delete (a
/// claim and its completion landed between its two statements) tries
/// again.
const RESET_ROUNDS: usize = 8;

/// A state code read back from the table.
fn state(key: &str, code: i8) -> Result<State, StoreError> {
    u8::try_from(code)
        .ok()
        .and_then(State::from_u8)
        .ok_or_else(|| {
            StoreError::corrupt(
                crate::BACKEND,
                format!("the record under {key:?} has state code {code}, which is no known state"),
            )
        })
}

/// The most keys one purge `DELETE` lists, so that a large `limit` never
/// becomes one huge statement.
const PURGE_CHUNK: usize = 500;

/// Idempotency records in one MariaDB table, on a sqlx pool.
///
/// Every method is one statement, so one round trip, and runs in its own
/// autocommit transaction; deadlines are computed and compared on the
/// database's clock. Cheap to clone: clones share the pool.
///
/// # Setting up
///
/// Build it with [`connect`](MySqlStore::connect) or, to share the
/// application's pool, [`from_pool`](MySqlStore::from_pool); pick the table
/// with [`with_table`](MySqlStore::with_table) (default
/// [`DEFAULT_TABLE`](crate::DEFAULT_TABLE)) and create it with
/// [`migrate`](MySqlStore::migrate) at start-up.
///
/// # Purging
///
/// Records past retention behave as absent at once, but their rows stay
/// until [`purge_expired`](Store::purge_expired) deletes them. Call it
/// periodically in batches (see the [crate docs](crate#purging-expired-records)).
///
/// # Isolation
///
/// The statements are correct under every isolation level: the claim and
/// the compare-and-sets read the row they change through InnoDB's locking
/// reads, which always see the latest committed version. See the
/// [crate docs](crate#locks-and-deadlocks) for the locks they take.
#[derive(Clone)]
pub struct MySqlStore {
    pub(crate) pool: MySqlPool,
    pub(crate) sql: Arc<Statements>,
    timeout: Duration,
}

/// How long one of the store's statements may take by default, the wait
/// for a connection included.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.sql.name.display())
            .field("pool", &self.pool)
            .finish()
    }
}

impl MySqlStore {
    /// Connects a new pool to `url` (for example
    /// `mysql://app@db.internal/app`) with sqlx's default pool options, and
    /// checks that one connection can be made.
    ///
    /// A malformed URL is a config error; an unreachable server a backend
    /// error. Like every acquisition from a sqlx pool, it keeps retrying a
    /// refused connection (a server that is starting) until the pool's
    /// acquire timeout, 30 s by default. To tune the pool (size, timeouts),
    /// build it yourself and use [`from_pool`](MySqlStore::from_pool).
    pub async fn connect(url: &str) -> Result<MySqlStore, StoreError> {
        let pool = MySqlPool::connect(url).await.map_err(error)?;
        Ok(MySqlStore::from_pool(pool))
    }

    /// Uses `pool`, which may be shared with the rest of the application:
    /// the store takes a connection only for the length of one statement,
    /// so work that uses the same pool cannot deadlock against it.
    ///
    /// sqlx pools ping a connection before handing it out unless built
    /// with `test_before_acquire(false)`. The ping replaces connections the
    /// server dropped while they were idle (a restart, a `KILL`) without an
    /// error reaching any caller; turning it off saves one network exchange
    /// per operation, and then each dropped connection fails one operation
    /// with a backend error before the pool replaces it.
    pub fn from_pool(pool: MySqlPool) -> MySqlStore {
        MySqlStore {
            pool,
            sql: Arc::new(Statements::new(TableName::default())),
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
    /// same key ([`complete_in`](MySqlStore::complete_in)) holds until it
    /// commits. Transactions you run ([`begin`](MySqlStore::begin)) are
    /// yours to bound.
    pub fn with_statement_timeout(mut self, timeout: Duration) -> MySqlStore {
        self.timeout = timeout;
        self
    }

    /// Uses the table `name`: `table` or `database.table`, each part an
    /// ASCII letter or `_` followed by ASCII letters, digits or `_`, at most
    /// 64 characters. Any other name is a config error. The name is checked
    /// here once and every statement is built from it now; it is quoted
    /// with backticks, so reserved words work as names.
    pub fn with_table(self, name: &str) -> Result<MySqlStore, StoreError> {
        let name = TableName::parse(name)?;
        Ok(MySqlStore {
            pool: self.pool,
            sql: Arc::new(Statements::new(name)),
            timeout: self.timeout,
        })
    }

    /// Creates the table, with its retention index, if it is missing;
    /// harmless when it exists. Safe to run from many processes at once:
    /// it is one `CREATE TABLE IF NOT EXISTS`, which the server serializes
    /// on the table's metadata lock. Creates no database: a database named
    /// in the table must exist.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        // The text protocol: DDL gains nothing from a prepared statement.
        sqlx::raw_sql(&self.sql.migrate)
            .execute(&self.pool)
            .await
            .map_err(error)?;
        Ok(())
    }

    /// The pool this store runs on.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The table name, as given to [`with_table`](MySqlStore::with_table).
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
        let done = rerun_deadlocks(|| async move {
            idem_sql::bounded!(self.pool, self.timeout, |c| {
                bind_record(sqlx::query(sql), record)
                    .bind(key)
                    .bind(&expected.as_bytes()[..])
                    .execute(c)
            })
        })
        .await?;
        Ok(done.rows_affected() == 1)
    }
}

/// Runs `statement` again while the server picks it as a deadlock victim,
/// at most [`DEADLOCK_RERUNS`] times, and types its error.
pub(crate) async fn rerun_deadlocks<T, F, Fut>(mut statement: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut reruns = 0;
    loop {
        match statement().await {
            Err(e) if is_deadlock(&e) && reruns < DEADLOCK_RERUNS => reruns += 1,
            done => return done.map_err(error),
        }
    }
}

/// Binds a record's columns, in the order every writing statement takes
/// them: token, fingerprint, state, payload, lease, retention.
pub(crate) fn bind_record<'q>(
    query: Query<'q, MySql, MySqlArguments>,
    record: &'q NewRecord<'q>,
) -> Query<'q, MySql, MySqlArguments> {
    query
        .bind(&record.token.as_bytes()[..])
        .bind(record.fingerprint.stored())
        .bind(record.state.as_u8())
        .bind(record.payload)
        .bind(record.lease.map(micros))
        .bind(micros(record.retention))
}

#[async_trait]
impl Store for MySqlStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let row = rerun_deadlocks(|| async move {
            idem_sql::bounded!(self.pool, self.timeout, |c| {
                bind_record(sqlx::query(&self.sql.insert).bind(key), record).fetch_one(c)
            })
        })
        .await?;
        let found = crate::row::record(&row)?;
        // Tokens are random 128-bit values: the row carries the caller's
        // own token exactly when this statement wrote it.
        if found.token == record.token {
            Ok(Insert::Inserted)
        } else {
            Ok(Insert::Found(found))
        }
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.write(&self.sql.swap, key, expected, record).await
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
        let done = rerun_deadlocks(|| async move {
            idem_sql::bounded!(self.pool, self.timeout, |c| {
                sqlx::query(&self.sql.remove)
                    .bind(key)
                    .bind(&expected.as_bytes()[..])
                    .execute(c)
            })
        })
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let query = sqlx::query(&self.sql.load).bind(key);
        let row = idem_sql::bounded!(self.pool, self.timeout, |c| query.fetch_optional(c))
            .map_err(error)?;
        row.map(|row| record(&row)).transpose()
    }

    /// The `DELETE … RETURNING` takes a settled row in one atomic step.
    /// When it deleted nothing, a locking read says what is there: an
    /// in-flight row or none is the answer at that read (nothing was
    /// deleted, and the read is a point where that is true); a settled row
    /// was written after the delete looked, so the delete runs again.
    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        for _ in 0..RESET_ROUNDS {
            let deleted: Option<i8> = rerun_deadlocks(|| async move {
                idem_sql::bounded!(self.pool, self.timeout, |c| {
                    sqlx::query_scalar(&self.sql.reset)
                        .bind(key)
                        .fetch_optional(c)
                })
            })
            .await?;
            if let Some(code) = deleted {
                return Ok(Reset::Deleted(state(key, code)?));
            }
            let found: Option<i8> = rerun_deadlocks(|| async move {
                idem_sql::bounded!(self.pool, self.timeout, |c| {
                    sqlx::query_scalar(&self.sql.live_state)
                        .bind(key)
                        .fetch_optional(c)
                })
            })
            .await?;
            match found.map(|code| state(key, code)).transpose()? {
                None => return Ok(Reset::Absent),
                Some(State::InFlight) => return Ok(Reset::InFlight),
                Some(_) => continue,
            }
        }
        Err(StoreError::backend(
            crate::BACKEND,
            format!("the record under {key:?} was settled again each time a reset looked"),
        ))
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        if limit == 0 {
            return Ok(0);
        }
        let query =
            sqlx::query_scalar(&self.sql.expired).bind(u64::try_from(limit).unwrap_or(u64::MAX));
        let keys: Vec<Vec<u8>> =
            idem_sql::bounded!(self.pool, self.timeout, |c| query.fetch_all(c)).map_err(error)?;
        let mut deleted = 0;
        for chunk in keys.chunks(PURGE_CHUNK) {
            let sql = &self.sql.delete_expired(chunk.len());
            let done = rerun_deadlocks(|| async move {
                idem_sql::bounded!(self.pool, self.timeout, |c| {
                    let mut query = sqlx::query(sql);
                    for key in chunk {
                        query = query.bind(key);
                    }
                    // Only full chunks repeat their text; the last, shorter
                    // one would crowd the connection's statement cache.
                    query.persistent(chunk.len() == PURGE_CHUNK).execute(c)
                })
            })
            .await?;
            deleted += usize::try_from(done.rows_affected()).unwrap_or(usize::MAX);
        }
        Ok(deleted)
    }
}
