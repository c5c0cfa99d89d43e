//! The PostgreSQL queue.

mod group;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::Row;

use idem_core::store::PreparedClaim;
use idem_core::Lease;
use idem_postgres::PostgresStore;

use super::{
    decode_history, decode_state, millis, valid_table_name, Enqueued, Job, JobId, JobInfo, NewJob,
    Queue, QueueError, Settle, SharedCommit, Token, DEFAULT_RETENTION,
};

const BACKEND: &str = "postgres";

/// The default table.
const DEFAULT_TABLE: &str = "idem_inbox_jobs";

/// How many grouped enqueue statements run at once, by default.
pub const DEFAULT_ENQUEUE_GROUPS: usize = 2;

/// A [`Queue`] in one PostgreSQL table.
///
/// Every deadline is computed by the server from `now()`, so workers'
/// clocks never decide a lease. A batch claim is one statement: `UPDATE …
/// WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING`, so concurrent
/// workers take disjoint batches without waiting on each other. Tokens are
/// `gen_random_uuid()` (PostgreSQL 13 or later).
///
/// # Grouped enqueues
///
/// Enqueues that arrive together — a receiver's concurrent deliveries —
/// are written together: at most
/// [`DEFAULT_ENQUEUE_GROUPS`] statements are on their way at once
/// ([`with_enqueue_groups`](PostgresQueue::with_enqueue_groups)), and each
/// carries every enqueue that arrived while the others were busy (up to
/// 256 jobs or 4 MiB of payload), as one `INSERT … SELECT FROM unnest(…)
/// ON CONFLICT` in one transaction. A lone enqueue goes at once, as a
/// single-row insert. Each caller still learns its own answer: a new job,
/// or a duplicate with the id of the job already held (two deliveries of
/// one event in one group: the first is new, the second its duplicate). A
/// group the server refuses is sent again one job at a time, so one bad
/// row fails only its own caller. Rows are inserted in (source, event id)
/// order, so concurrent groups take their row locks in one order and
/// cannot deadlock.
///
/// Why: each single-row enqueue costs the server a statement, a
/// transaction and a commit, and the client a round trip; under a burst
/// of deliveries these, not the rows, are the work
/// (`dev/idem-bench/notes/2026-11-30-inbox.md`).
#[derive(Debug, Clone)]
pub struct PostgresQueue {
    pool: PgPool,
    table: String,
    retention: Duration,
    sql: Arc<Sql>,
    /// `None` sends each enqueue alone.
    groups: Option<Arc<group::Groups>>,
    /// The idem store whose records the queue's commits carry, if any.
    store: Option<PostgresStore>,
}

/// The statements, built once from the validated table name.
#[derive(Debug, Clone)]
struct Sql {
    schema: [String; 5],
    enqueue: String,
    /// Serialises the enqueues that share a dedupe key, held by key, and
    /// names the job with the keys.
    lock_key: String,
    held_by_key: String,
    remember_keys: String,
    enqueue_group: String,
    duplicate: String,
    duplicates: String,
    /// Whether the table lacks the `lapses` column (made by an earlier
    /// build), and the statement that adds it.
    lapses_missing: String,
    add_lapses: String,
    claim: String,
    heartbeat: String,
    complete: String,
    complete_many: String,
    retry: String,
    release: String,
    dead_letter: String,
    dead_letters: String,
    inspect: String,
    requeue: String,
    purge: String,
    depth: String,
}

const JOB_COLUMNS: &str = "id, source, event_id, payload, attempts, lapses, last_error, token";
const INFO_COLUMNS: &str =
    "id, source, event_id, payload, state, attempts, lapses, last_error, history::text AS history";

impl Sql {
    fn new(t: &str) -> Sql {
        let fence = "WHERE id = $1 AND token = $2 AND state = 'running'";
        let append = "history = history || jsonb_build_array(jsonb_build_object(
                'attempt', attempts, 'error', $3::text,
                'at_ms', floor(extract(epoch FROM now()) * 1000)::bigint))";
        Sql {
            schema: [
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        id           BIGSERIAL PRIMARY KEY,
                        source       TEXT        NOT NULL,
                        event_id     TEXT        NOT NULL,
                        payload      BYTEA       NOT NULL,
                        state        TEXT        NOT NULL,
                        attempts     INTEGER     NOT NULL,
                        lapses       INTEGER     NOT NULL DEFAULT 0,
                        run_after    TIMESTAMPTZ NOT NULL,
                        lease_until  TIMESTAMPTZ,
                        token        BYTEA,
                        last_error   TEXT,
                        history      JSONB       NOT NULL,
                        dedupe_until TIMESTAMPTZ NOT NULL,
                        UNIQUE (source, event_id))"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_due ON {t} (run_after) WHERE state = 'pending'"),
                format!("CREATE INDEX IF NOT EXISTS {t}_lease ON {t} (lease_until) WHERE state = 'running'"),
                // No foreign key: it would make a plain `DROP TABLE` of the
                // jobs fail, and the purge deletes a job's keys with it.
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_keys (
                        source TEXT   NOT NULL,
                        key    TEXT   NOT NULL,
                        job_id BIGINT NOT NULL,
                        PRIMARY KEY (source, key))"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_keys_job ON {t}_keys (job_id)"),
            ],
            lock_key: format!(
                // A collision of the hashes only makes two enqueues wait
                // for each other.
                "SELECT pg_advisory_xact_lock(hashtext('{t}/' || $1), hashtext($2))"
            ),
            held_by_key: format!(
                "SELECT j.id FROM {t}_keys AS k JOIN {t} AS j ON j.id = k.job_id
                 WHERE k.source = $1 AND k.key = ANY($2)
                   AND NOT (j.state = 'done' AND j.dedupe_until <= now())
                 LIMIT 1"
            ),
            remember_keys: format!(
                "INSERT INTO {t}_keys (source, key, job_id) SELECT $1, unnest($2::text[]), $3
                 ON CONFLICT (source, key) DO UPDATE SET job_id = excluded.job_id"
            ),
            enqueue: format!(
                "INSERT INTO {t} AS j
                     (source, event_id, payload, state, attempts, run_after, history, dedupe_until)
                 VALUES ($1, $2, $3, 'pending', 0,
                         now() + $4::float8 * interval '1 millisecond', '[]',
                         now() + $5::float8 * interval '1 millisecond')
                 ON CONFLICT (source, event_id) DO UPDATE SET
                     payload = excluded.payload, state = 'pending', attempts = 0, lapses = 0,
                     run_after = excluded.run_after, lease_until = NULL, token = NULL,
                     last_error = NULL, history = '[]', dedupe_until = excluded.dedupe_until
                 WHERE j.state = 'done' AND j.dedupe_until <= now()
                 RETURNING id"
            ),
            enqueue_group: format!(
                "INSERT INTO {t} AS j
                     (source, event_id, payload, state, attempts, run_after, history, dedupe_until)
                 SELECT i.source, i.event_id, i.payload, 'pending', 0,
                        now() + i.delay * interval '1 millisecond', '[]',
                        now() + $5::float8 * interval '1 millisecond'
                 FROM unnest($1::text[], $2::text[], $3::bytea[], $4::float8[])
                     AS i(source, event_id, payload, delay)
                 ORDER BY i.source, i.event_id
                 ON CONFLICT (source, event_id) DO UPDATE SET
                     payload = excluded.payload, state = 'pending', attempts = 0, lapses = 0,
                     run_after = excluded.run_after, lease_until = NULL, token = NULL,
                     last_error = NULL, history = '[]', dedupe_until = excluded.dedupe_until
                 WHERE j.state = 'done' AND j.dedupe_until <= now()
                 RETURNING id, source, event_id"
            ),
            duplicate: format!("SELECT id FROM {t} WHERE source = $1 AND event_id = $2"),
            duplicates: format!(
                "SELECT j.id, j.source, j.event_id
                 FROM unnest($1::text[], $2::text[]) AS i(source, event_id)
                 JOIN {t} AS j ON j.source = i.source AND j.event_id = i.event_id"
            ),
            lapses_missing: format!(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_attribute
                     WHERE attrelid = to_regclass('{t}') AND attname = 'lapses' AND NOT attisdropped)"
            ),
            add_lapses: format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS lapses INTEGER NOT NULL DEFAULT 0"
            ),
            claim: format!(
                "UPDATE {t}
                 SET state = 'running',
                     attempts = attempts + CASE state WHEN 'running' THEN 0 ELSE 1 END,
                     lapses = lapses + CASE state WHEN 'running' THEN 1 ELSE 0 END,
                     token = uuid_send(gen_random_uuid()),
                     lease_until = now() + $2::float8 * interval '1 millisecond'
                 WHERE id IN (
                     SELECT id FROM {t}
                     WHERE (state = 'pending' AND run_after <= now())
                        OR (state = 'running' AND lease_until <= now())
                     ORDER BY run_after, id
                     LIMIT $1
                     FOR UPDATE SKIP LOCKED)
                 RETURNING {JOB_COLUMNS}"
            ),
            heartbeat: format!(
                "UPDATE {t} SET lease_until = now() + $3::float8 * interval '1 millisecond' {fence}"
            ),
            complete: format!(
                "UPDATE {t} SET state = 'done', token = NULL, lease_until = NULL, run_after = now() {fence}"
            ),
            complete_many: format!(
                "UPDATE {t} AS j
                 SET state = 'done', token = NULL, lease_until = NULL, run_after = now()
                 FROM unnest($1::bigint[], $2::bytea[]) AS c(id, token)
                 WHERE j.id = c.id AND j.token = c.token AND j.state = 'running'
                 RETURNING c.id, c.token"
            ),
            retry: format!(
                "UPDATE {t}
                 SET state = 'pending', token = NULL, lease_until = NULL,
                     run_after = now() + $4::float8 * interval '1 millisecond',
                     last_error = $3, {append}
                 {fence}"
            ),
            release: format!(
                "UPDATE {t}
                 SET state = 'pending', attempts = greatest(attempts - 1, 0), token = NULL,
                     lease_until = NULL, run_after = now()
                 {fence}"
            ),
            dead_letter: format!(
                "UPDATE {t}
                 SET state = 'dead', token = NULL, lease_until = NULL, last_error = $3, {append}
                 {fence}"
            ),
            dead_letters: format!(
                "SELECT {INFO_COLUMNS} FROM {t} WHERE state = 'dead' ORDER BY id LIMIT $1"
            ),
            inspect: format!("SELECT {INFO_COLUMNS} FROM {t} WHERE id = $1"),
            requeue: format!(
                "UPDATE {t} SET state = 'pending', attempts = 0, lapses = 0, run_after = now()
                 WHERE id = $1 AND state = 'dead'"
            ),
            purge: format!(
                "WITH gone AS (
                     DELETE FROM {t} WHERE id IN (
                         SELECT id FROM {t} WHERE state = 'done' AND dedupe_until <= now()
                         LIMIT $1 FOR UPDATE SKIP LOCKED)
                     RETURNING id),
                 keys AS (DELETE FROM {t}_keys WHERE job_id IN (SELECT id FROM gone))
                 SELECT count(*) FROM gone"
            ),
            depth: format!("SELECT count(*) FROM {t} WHERE state IN ('pending', 'running')"),
        }
    }
}

impl PostgresQueue {
    /// Connects to `url` with a pool of 10 connections.
    pub async fn connect(url: &str) -> Result<PostgresQueue, QueueError> {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect(url)
            .await
            .map_err(backend)?;
        Ok(PostgresQueue::from_pool(pool))
    }

    /// A queue over an existing pool, in the default table
    /// `idem_inbox_jobs`. Call [`migrate`](PostgresQueue::migrate) once.
    pub fn from_pool(pool: PgPool) -> PostgresQueue {
        PostgresQueue {
            pool,
            table: DEFAULT_TABLE.to_owned(),
            retention: DEFAULT_RETENTION,
            sql: Arc::new(Sql::new(DEFAULT_TABLE)),
            groups: Some(Arc::new(group::Groups::new(DEFAULT_ENQUEUE_GROUPS))),
            store: None,
        }
    }

    /// Claims idem's keys for the worker in the queue's own commits
    /// ([`SharedCommit`]): a batch of jobs is claimed together with idem's
    /// claims of their event keys, in one transaction, where a worker
    /// otherwise makes idem's claim, and its commit, for every job on top
    /// of the queue's.
    ///
    /// `store` must be the store the worker's `Idempotent` uses (the same
    /// table) and on the queue's database; the worker checks the first
    /// when it starts (and otherwise keeps the records apart, logging an
    /// error), and the store refuses a connection to another database.
    ///
    /// What changes for a job: its idem lease starts when the job is
    /// claimed rather than when its handler starts, and is renewed while it
    /// waits for a free handler (a job given back before its handler
    /// started gives its key back too). A redelivered event whose key
    /// holds a record (an outcome, or a run in flight elsewhere) goes
    /// through `execute` as before. The outcome is recorded the moment the
    /// handler returns, as `execute` records it.
    pub fn with_store(mut self, store: PostgresStore) -> PostgresQueue {
        self.store = Some(store);
        self
    }

    /// Lets at most `statements` grouped enqueue statements run at once
    /// (default [`DEFAULT_ENQUEUE_GROUPS`]; see "Grouped enqueues" above);
    /// `0` sends every enqueue alone, as many at once as the pool allows.
    /// Keep it below the pool's size, so claims and settlements find a
    /// connection while enqueues are busy.
    pub fn with_enqueue_groups(mut self, statements: usize) -> PostgresQueue {
        self.groups = (statements > 0).then(|| Arc::new(group::Groups::new(statements)));
        self
    }

    /// Uses the table `name`: 1–48 ASCII letters, digits and underscores,
    /// not starting with a digit (it is spliced into SQL, so it is checked
    /// here, once).
    pub fn with_table(mut self, name: &str) -> Result<PostgresQueue, QueueError> {
        if !valid_table_name(name) {
            return Err(QueueError::InvalidName(name.to_owned()));
        }
        self.table = name.to_owned();
        self.sql = Arc::new(Sql::new(name));
        Ok(self)
    }

    /// How long a completed event is remembered (default three days).
    pub fn with_retention(mut self, retention: Duration) -> PostgresQueue {
        self.retention = retention;
        self
    }

    /// The table the jobs live in.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Creates the table and indexes if they are missing, and brings a
    /// table an earlier build made up to date (its jobs keep their state and
    /// count no lapses yet); safe to call again. The jobs' dedupe keys
    /// ([`NewJob::dedupe_keys`](crate::queue::NewJob::dedupe_keys)) live
    /// beside them in `<table>_keys`.
    pub async fn migrate(&self) -> Result<(), QueueError> {
        for statement in &self.sql.schema {
            sqlx::query(statement)
                .execute(&self.pool)
                .await
                .map_err(backend)?;
        }
        // Looked up first: `ALTER TABLE` waits for every transaction open on
        // the table, and a running queue's table always has some.
        let missing: bool = sqlx::query_scalar(&self.sql.lapses_missing)
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?;
        if missing {
            sqlx::query(&self.sql.add_lapses)
                .execute(&self.pool)
                .await
                .map_err(backend)?;
        }
        Ok(())
    }

    async fn fenced(&self, sql: &str, job: &Job, extra: Extra<'_>) -> Result<Settle, QueueError> {
        let query = sqlx::query(sql)
            .bind(parse_id(&job.id))
            .bind(job.token.as_bytes());
        let query = match extra {
            Extra::None => query,
            Extra::Millis(ms) => query.bind(ms as f64),
            Extra::Error(e) => query.bind(e),
            Extra::ErrorAndMillis(e, ms) => query.bind(e).bind(ms as f64),
        };
        let done = query.execute(&self.pool).await.map_err(backend)?;
        Ok(if done.rows_affected() == 1 {
            Settle::Applied
        } else {
            Settle::LeaseLost
        })
    }
}

/// Enqueues one job with a single-row insert.
async fn enqueue_one(
    pool: &PgPool,
    sql: &Sql,
    retention_ms: i64,
    job: NewJob,
) -> Result<Enqueued, QueueError> {
    loop {
        let inserted: Option<i64> = sqlx::query_scalar(&sql.enqueue)
            .bind(&job.source)
            .bind(&job.event_id)
            .bind(&job.payload)
            .bind(millis(job.delay) as f64)
            .bind(retention_ms as f64)
            .fetch_optional(pool)
            .await
            .map_err(backend)?;
        if let Some(id) = inserted {
            return Ok(Enqueued::New(JobId::new(id.to_string())));
        }
        // The conflicting row is committed (ON CONFLICT waited for it), and
        // only a purge of a completed, expired job removes rows, so it is
        // there to be read unless a purge ran in between; then insert again.
        let held: Option<i64> = sqlx::query_scalar(&sql.duplicate)
            .bind(&job.source)
            .bind(&job.event_id)
            .fetch_optional(pool)
            .await
            .map_err(backend)?;
        if let Some(id) = held {
            return Ok(Enqueued::Duplicate(JobId::new(id.to_string())));
        }
    }
}

/// Enqueues a job with dedupe keys: under an advisory lock per key, so
/// two deliveries sharing a key cannot both miss it, it is a duplicate of
/// the live job a key names, else inserted (or held) by its event id; the
/// keys then name the job returned.
async fn enqueue_keyed(
    pool: &PgPool,
    sql: &Sql,
    retention_ms: i64,
    job: NewJob,
) -> Result<Enqueued, QueueError> {
    let mut keys = job.dedupe_keys.clone();
    // One order for every caller, so two keyed enqueues cannot deadlock.
    keys.sort();
    keys.dedup();
    let mut tx = pool.begin().await.map_err(backend)?;
    for key in &keys {
        sqlx::query(&sql.lock_key)
            .bind(&job.source)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
    }
    let held: Option<i64> = sqlx::query_scalar(&sql.held_by_key)
        .bind(&job.source)
        .bind(&keys)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
    let enqueued = match held {
        Some(id) => Enqueued::Duplicate(JobId::new(id.to_string())),
        None => loop {
            let inserted: Option<i64> = sqlx::query_scalar(&sql.enqueue)
                .bind(&job.source)
                .bind(&job.event_id)
                .bind(&job.payload)
                .bind(millis(job.delay) as f64)
                .bind(retention_ms as f64)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
            if let Some(id) = inserted {
                break Enqueued::New(JobId::new(id.to_string()));
            }
            // As in `enqueue_one`: the conflicting row is there unless a
            // purge removed it in between.
            let held: Option<i64> = sqlx::query_scalar(&sql.duplicate)
                .bind(&job.source)
                .bind(&job.event_id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
            if let Some(id) = held {
                break Enqueued::Duplicate(JobId::new(id.to_string()));
            }
        },
    };
    sqlx::query(&sql.remember_keys)
        .bind(&job.source)
        .bind(&keys)
        .bind(parse_id(enqueued.id()))
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
    tx.commit().await.map_err(backend)?;
    Ok(enqueued)
}

/// The parameters a fenced statement takes after the id and the token.
enum Extra<'a> {
    None,
    Millis(i64),
    Error(&'a str),
    ErrorAndMillis(&'a str, i64),
}

fn backend(e: sqlx::Error) -> QueueError {
    QueueError::Backend {
        backend: BACKEND,
        source: Box::new(e),
    }
}

/// A job id this backend issued; any other text names no job.
fn parse_id(id: &JobId) -> i64 {
    id.as_str().parse().unwrap_or(-1)
}

fn job(row: &PgRow) -> Result<Job, sqlx::Error> {
    Ok(Job {
        id: JobId::new(row.try_get::<i64, _>("id")?.to_string()),
        source: row.try_get("source")?,
        event_id: row.try_get("event_id")?,
        payload: row.try_get("payload")?,
        attempts: row.try_get::<i32, _>("attempts")?.max(0) as u32,
        lapses: row.try_get::<i32, _>("lapses")?.max(0) as u32,
        last_error: row.try_get("last_error")?,
        token: Token::from_bytes(row.try_get::<Vec<u8>, _>("token")?),
    })
}

fn info(row: &PgRow) -> Result<JobInfo, QueueError> {
    let state: String = row.try_get("state").map_err(backend)?;
    let history: String = row.try_get("history").map_err(backend)?;
    Ok(JobInfo {
        id: JobId::new(row.try_get::<i64, _>("id").map_err(backend)?.to_string()),
        source: row.try_get("source").map_err(backend)?,
        event_id: row.try_get("event_id").map_err(backend)?,
        payload: row.try_get("payload").map_err(backend)?,
        state: decode_state(BACKEND, &state)?,
        attempts: row.try_get::<i32, _>("attempts").map_err(backend)?.max(0) as u32,
        lapses: row.try_get::<i32, _>("lapses").map_err(backend)?.max(0) as u32,
        last_error: row.try_get("last_error").map_err(backend)?,
        history: decode_history(BACKEND, &history)?,
    })
}

#[async_trait]
impl Queue for PostgresQueue {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued, QueueError> {
        let retention = millis(self.retention);
        if !job.dedupe_keys.is_empty() {
            // Checked and written in one transaction of its own, outside
            // the grouped statements, which know only the event id.
            return enqueue_keyed(&self.pool, &self.sql, retention, job).await;
        }
        match &self.groups {
            Some(groups) => groups.enqueue(&self.pool, &self.sql, retention, job).await,
            None => enqueue_one(&self.pool, &self.sql, retention, job).await,
        }
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Job>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(&self.sql.claim)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .bind(millis(lease) as f64)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        rows.iter()
            .map(job)
            .collect::<Result<_, _>>()
            .map_err(backend)
    }

    async fn heartbeat(&self, job: &Job, lease: Duration) -> Result<Settle, QueueError> {
        self.fenced(&self.sql.heartbeat, job, Extra::Millis(millis(lease)))
            .await
    }

    async fn complete(&self, job: &Job) -> Result<Settle, QueueError> {
        self.fenced(&self.sql.complete, job, Extra::None).await
    }

    async fn complete_many(&self, jobs: &[Job]) -> Result<Vec<Settle>, QueueError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = jobs.iter().map(|job| parse_id(&job.id)).collect();
        let tokens: Vec<&[u8]> = jobs.iter().map(|job| job.token.as_bytes()).collect();
        // One statement: each row is fenced by its own token, and the rows
        // that matched come back as (id, token) so every job learns its
        // own settlement.
        let applied: Vec<(i64, Vec<u8>)> = sqlx::query_as(&self.sql.complete_many)
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        let applied: std::collections::HashSet<(i64, Vec<u8>)> = applied.into_iter().collect();
        Ok(jobs
            .iter()
            .zip(ids)
            .map(|(job, id)| {
                if applied.contains(&(id, job.token.as_bytes().to_vec())) {
                    Settle::Applied
                } else {
                    Settle::LeaseLost
                }
            })
            .collect())
    }

    async fn retry(&self, job: &Job, delay: Duration, error: &str) -> Result<Settle, QueueError> {
        self.fenced(
            &self.sql.retry,
            job,
            Extra::ErrorAndMillis(error, millis(delay)),
        )
        .await
    }

    async fn release(&self, job: &Job) -> Result<Settle, QueueError> {
        self.fenced(&self.sql.release, job, Extra::None).await
    }

    async fn dead_letter(&self, job: &Job, error: &str) -> Result<Settle, QueueError> {
        self.fenced(&self.sql.dead_letter, job, Extra::Error(error))
            .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<JobInfo>, QueueError> {
        let rows = sqlx::query(&self.sql.dead_letters)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        rows.iter().map(info).collect()
    }

    async fn inspect(&self, id: &JobId) -> Result<Option<JobInfo>, QueueError> {
        let row = sqlx::query(&self.sql.inspect)
            .bind(parse_id(id))
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        row.as_ref().map(info).transpose()
    }

    async fn requeue(&self, id: &JobId) -> Result<bool, QueueError> {
        let done = sqlx::query(&self.sql.requeue)
            .bind(parse_id(id))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, QueueError> {
        let deleted: i64 = sqlx::query_scalar(&self.sql.purge)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?;
        Ok(u64::try_from(deleted).unwrap_or(0))
    }

    async fn depth(&self) -> Result<Option<u64>, QueueError> {
        let depth: i64 = sqlx::query_scalar(&self.sql.depth)
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?;
        Ok(Some(u64::try_from(depth).unwrap_or(0)))
    }

    fn shared_commit(&self) -> Option<&dyn SharedCommit> {
        self.store.as_ref().map(|_| self as &dyn SharedCommit)
    }
}

impl PostgresQueue {
    fn shared_store(&self) -> Result<&PostgresStore, QueueError> {
        self.store.as_ref().ok_or_else(|| QueueError::Backend {
            backend: BACKEND,
            source: "the queue shares no store's commits (see PostgresQueue::with_store)".into(),
        })
    }
}

#[async_trait]
impl SharedCommit for PostgresQueue {
    async fn claim_keys(&self, claims: &[PreparedClaim]) -> Result<Vec<bool>, QueueError> {
        let store = self.shared_store()?;
        let mut conn = self.pool.acquire().await.map_err(backend)?;
        store
            .claim_many_in(&mut conn, claims)
            .await
            .map_err(store_failed)
    }

    async fn claim_with_keys(
        &self,
        max: usize,
        lease: Duration,
        prepare: &(dyn for<'j> Fn(&'j Job) -> Option<PreparedClaim> + Send + Sync),
    ) -> Result<Vec<(Job, Option<Lease>)>, QueueError> {
        let store = self.shared_store()?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut tx = idem_sql::begin(&self.pool).await.map_err(backend)?;
        let rows = sqlx::query(&self.sql.claim)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .bind(millis(lease) as f64)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
        let jobs = rows
            .iter()
            .map(job)
            .collect::<Result<Vec<_>, _>>()
            .map_err(backend)?;
        let prepared: Vec<Option<PreparedClaim>> = jobs.iter().map(prepare).collect();
        let has_claim: Vec<bool> = prepared.iter().map(Option::is_some).collect();
        let batch: Vec<PreparedClaim> = prepared.into_iter().flatten().collect();
        let inserted = store
            .claim_many_in(&mut tx, &batch)
            .await
            .map_err(store_failed)?;
        // Dropped without a commit, the transaction rolls back: no job
        // claimed, no key claimed.
        tx.commit().await.map_err(backend)?;
        let mut leases = batch
            .into_iter()
            .zip(inserted)
            .map(|(claim, inserted)| inserted.then(|| claim.inserted()));
        Ok(jobs
            .into_iter()
            .zip(has_claim)
            .map(|(job, has_claim)| {
                let lease = if has_claim {
                    leases.next().flatten()
                } else {
                    None
                };
                (job, lease)
            })
            .collect())
    }
}

fn store_failed(e: idem_core::store::StoreError) -> QueueError {
    QueueError::Backend {
        backend: BACKEND,
        source: Box::new(e),
    }
}
