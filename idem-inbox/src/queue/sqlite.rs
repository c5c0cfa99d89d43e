//! The embedded SQLite queue.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, Row};
use tokio::sync::oneshot;

use super::{
    decode_history, decode_state, millis, Enqueued, Job, JobId, JobInfo, NewJob, Queue, QueueError,
    Settle, Token, DEFAULT_RETENTION,
};
use crate::Clock;

const BACKEND: &str = "sqlite";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS inbox_jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    state        TEXT    NOT NULL,
    attempts     INTEGER NOT NULL,
    lapses       INTEGER NOT NULL DEFAULT 0,
    run_after    INTEGER NOT NULL,
    lease_until  INTEGER,
    token        BLOB,
    last_error   TEXT,
    history      TEXT    NOT NULL,
    dedupe_until INTEGER NOT NULL,
    UNIQUE (source, event_id)
);
CREATE INDEX IF NOT EXISTS inbox_jobs_due ON inbox_jobs (state, run_after);
CREATE INDEX IF NOT EXISTS inbox_jobs_lease ON inbox_jobs (state, lease_until);
CREATE TABLE IF NOT EXISTS inbox_job_keys (
    source TEXT    NOT NULL,
    key    TEXT    NOT NULL,
    job_id INTEGER NOT NULL,
    PRIMARY KEY (source, key)
);
CREATE INDEX IF NOT EXISTS inbox_job_keys_job ON inbox_job_keys (job_id);
";

const JOB_COLUMNS: &str = "id, source, event_id, payload, attempts, lapses, last_error, token";
const INFO_COLUMNS: &str =
    "id, source, event_id, payload, state, attempts, lapses, last_error, history";

/// A [`Queue`] in one SQLite file: WAL, full synchronous commits, so a job
/// acknowledged as enqueued survives a crash of the process or the machine.
///
/// Deadlines are kept on the local clock (the database is embedded, so its
/// clock is this machine's), or on the [`Clock`] given to
/// [`with_clock`](SqliteQueue::with_clock). Operations run one at a time on one
/// connection, off the async threads.
///
/// Commits are grouped: enqueues that arrive while the connection is busy
/// are written together in one transaction by whichever of them gets the
/// connection first, and each is answered once that transaction is
/// durable — one `fsync` for the group instead of one each, which is what
/// bounds the acknowledgement latency of a busy receiver. Completions a
/// worker groups ([`Queue::complete_many`]) share one commit the same way.
/// If a grouped commit fails, its enqueues are retried one transaction
/// each, so every caller gets its own answer and one bad job fails alone.
#[derive(Debug, Clone)]
pub struct SqliteQueue {
    conn: Arc<Mutex<Connection>>,
    retention: Duration,
    clock: Clock,
    /// Enqueues waiting for the connection; whoever takes it next commits
    /// them all in one transaction.
    pending: Arc<Mutex<Vec<PendingEnqueue>>>,
}

/// An enqueue waiting for a group commit, and where its answer goes.
type PendingEnqueue = (NewJob, oneshot::Sender<Result<Enqueued, QueueError>>);

impl SqliteQueue {
    /// Opens (creating if needed) the queue in the file at `path`.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteQueue, QueueError> {
        let path = path.as_ref().to_owned();
        let conn = tokio::task::spawn_blocking(move || {
            let conn = Connection::open(path)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn.busy_timeout(Duration::from_secs(5))?;
            Ok::<_, rusqlite::Error>(conn)
        })
        .await
        .map_err(backend)?
        .map_err(backend)?;
        let queue = SqliteQueue {
            conn: Arc::new(Mutex::new(conn)),
            retention: DEFAULT_RETENTION,
            clock: Clock::system(),
            pending: Arc::new(Mutex::new(Vec::new())),
        };
        queue.migrate().await?;
        Ok(queue)
    }

    /// How long a completed event is remembered (default three days).
    pub fn with_retention(mut self, retention: Duration) -> SqliteQueue {
        self.retention = retention;
        self
    }

    /// Reads the time from `clock` instead of the system clock: leases,
    /// retry delays and retention are measured on it. A test that sets the
    /// clock decides when a lease lapses, whatever the machine's load.
    pub fn with_clock(mut self, clock: Clock) -> SqliteQueue {
        self.clock = clock;
        self
    }

    /// Creates the table and indexes if they are missing, and brings a
    /// table an earlier build made up to date (its jobs keep their state and
    /// count no lapses yet); safe to call again.
    pub async fn migrate(&self) -> Result<(), QueueError> {
        self.run(|conn| {
            let tx = conn.transaction()?;
            tx.execute_batch(SCHEMA)?;
            let has_lapses: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM pragma_table_info('inbox_jobs')
                     WHERE name = 'lapses')",
                [],
                |row| row.get(0),
            )?;
            if !has_lapses {
                tx.execute_batch(
                    "ALTER TABLE inbox_jobs ADD COLUMN lapses INTEGER NOT NULL DEFAULT 0",
                )?;
            }
            tx.commit()
        })
        .await
    }

    async fn run<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock cannot leave a half-applied
            // statement: SQLite rolls back what was not committed.
            f(&mut lock(&conn))
        })
        .await
        .map_err(backend)?
        .map_err(backend)
    }

    /// Runs `sql` on the job when `job`'s token still holds it. The
    /// statement's parameters are ?1 the id, ?2 the token, ?3 now, then
    /// `extra`.
    async fn fenced(
        &self,
        job: &Job,
        sql: &'static str,
        extra: Vec<rusqlite::types::Value>,
    ) -> Result<Settle, QueueError> {
        let id = parse_id(&job.id);
        let token = job.token.as_bytes().to_vec();
        let clock = self.clock.clone();
        let changed = self
            .run(move |conn| {
                let mut values: Vec<rusqlite::types::Value> =
                    vec![id.into(), token.into(), clock.now_millis().into()];
                values.extend(extra);
                conn.prepare_cached(sql)?
                    .execute(rusqlite::params_from_iter(values))
            })
            .await?;
        Ok(if changed == 1 {
            Settle::Applied
        } else {
            Settle::LeaseLost
        })
    }
}

fn backend(e: impl std::error::Error + Send + Sync + 'static) -> QueueError {
    QueueError::Backend {
        backend: BACKEND,
        source: Box::new(e),
    }
}

/// A job id this backend issued; any other text names no job.
fn parse_id(id: &JobId) -> i64 {
    id.as_str().parse().unwrap_or(-1)
}

/// Locks `mutex`; a panic while it was held leaves nothing half-done (the
/// data are plain values, and SQLite rolls back what was not committed).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Commits `group` in one transaction and answers each enqueue once it is
/// durable. If anything in it fails, the transaction is rolled back and
/// each enqueue is tried in a transaction of its own, so a bad job fails
/// alone and every caller gets its own error.
fn enqueue_group(conn: &mut Connection, group: Vec<PendingEnqueue>, retention: i64, clock: &Clock) {
    let together = (|| {
        let tx = conn.transaction()?;
        let now = clock.now_millis();
        let mut answers = Vec::with_capacity(group.len());
        for (job, _) in &group {
            answers.push(enqueue_one(&tx, job, now, retention)?);
        }
        tx.commit()?;
        Ok::<_, rusqlite::Error>(answers)
    })();
    match together {
        Ok(answers) => {
            for ((_, answer), enqueued) in group.into_iter().zip(answers) {
                // A caller that gave up waiting has no one to tell.
                let _ = answer.send(Ok(enqueued));
            }
        }
        Err(_) => {
            for (job, answer) in group {
                let alone = (|| {
                    let tx = conn.transaction()?;
                    let enqueued = enqueue_one(&tx, &job, clock.now_millis(), retention)?;
                    tx.commit()?;
                    Ok::<_, rusqlite::Error>(enqueued)
                })();
                let _ = answer.send(alone.map_err(backend));
            }
        }
    }
}

/// Inserts `job` unless its event, or one of its dedupe keys, is held,
/// within the caller's transaction; the keys then name whichever job it
/// returns.
fn enqueue_one(
    tx: &rusqlite::Transaction<'_>,
    job: &NewJob,
    now: i64,
    retention: i64,
) -> rusqlite::Result<Enqueued> {
    let enqueued = match held_by_key(tx, job, now)? {
        Some(id) => Enqueued::Duplicate(JobId::new(id.to_string())),
        None => enqueue_by_id(tx, job, now, retention)?,
    };
    for key in &job.dedupe_keys {
        tx.prepare_cached(
            "INSERT INTO inbox_job_keys (source, key, job_id) VALUES (?1, ?2, ?3)
             ON CONFLICT (source, key) DO UPDATE SET job_id = excluded.job_id",
        )?
        .execute(params![job.source, key, parse_id(enqueued.id())])?;
    }
    Ok(enqueued)
}

/// The live job one of `job`'s dedupe keys names. A key outlives nothing:
/// it counts only while its job would still dedupe by its event id.
fn held_by_key(
    tx: &rusqlite::Transaction<'_>,
    job: &NewJob,
    now: i64,
) -> rusqlite::Result<Option<i64>> {
    for key in &job.dedupe_keys {
        let held: Option<i64> = tx
            .prepare_cached(
                "SELECT j.id FROM inbox_job_keys AS k JOIN inbox_jobs AS j ON j.id = k.job_id
                 WHERE k.source = ?1 AND k.key = ?2
                   AND NOT (j.state = 'done' AND j.dedupe_until <= ?3)",
            )?
            .query_row(params![job.source, key, now], |row| row.get(0))
            .optional()?;
        if held.is_some() {
            return Ok(held);
        }
    }
    Ok(None)
}

/// Inserts `job` unless its event id is held.
fn enqueue_by_id(
    tx: &rusqlite::Transaction<'_>,
    job: &NewJob,
    now: i64,
    retention: i64,
) -> rusqlite::Result<Enqueued> {
    // A completed job past its retention is forgotten: the event starts
    // over in the same row.
    let inserted: Option<i64> = tx
        .prepare_cached(
            "INSERT INTO inbox_jobs
                 (source, event_id, payload, state, attempts, run_after, history, dedupe_until)
             VALUES (?1, ?2, ?3, 'pending', 0, ?4 + ?5, '[]', ?4 + ?6)
             ON CONFLICT (source, event_id) DO UPDATE SET
                 payload = excluded.payload, state = 'pending', attempts = 0, lapses = 0,
                 run_after = excluded.run_after, lease_until = NULL, token = NULL,
                 last_error = NULL, history = '[]', dedupe_until = excluded.dedupe_until
             WHERE inbox_jobs.state = 'done' AND inbox_jobs.dedupe_until <= ?4
             RETURNING id",
        )?
        .query_row(
            params![
                job.source,
                job.event_id,
                job.payload,
                now,
                millis(job.delay),
                retention
            ],
            |row| row.get(0),
        )
        .optional()?;
    Ok(match inserted {
        Some(id) => Enqueued::New(JobId::new(id.to_string())),
        None => {
            let id: i64 = tx
                .prepare_cached("SELECT id FROM inbox_jobs WHERE source = ?1 AND event_id = ?2")?
                .query_row(params![job.source, job.event_id], |row| row.get(0))?;
            Enqueued::Duplicate(JobId::new(id.to_string()))
        }
    })
}

const COMPLETE: &str =
    // A done job's run_after says when it completed.
    "UPDATE inbox_jobs SET state = 'done', token = NULL, lease_until = NULL, run_after = ?3
     WHERE id = ?1 AND token = ?2 AND state = 'running'";

fn job_from_row(row: &Row<'_>) -> rusqlite::Result<Job> {
    Ok(Job {
        id: JobId::new(row.get::<_, i64>(0)?.to_string()),
        source: row.get(1)?,
        event_id: row.get(2)?,
        payload: row.get(3)?,
        attempts: row.get(4)?,
        lapses: row.get(5)?,
        last_error: row.get(6)?,
        token: Token::from_bytes(row.get::<_, Vec<u8>>(7)?),
    })
}

type InfoRow = (
    i64,
    String,
    String,
    Vec<u8>,
    String,
    u32,
    u32,
    Option<String>,
    String,
);

fn info_row(row: &Row<'_>) -> rusqlite::Result<InfoRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
    ))
}

fn info(row: InfoRow) -> Result<JobInfo, QueueError> {
    let (id, source, event_id, payload, state, attempts, lapses, last_error, history) = row;
    Ok(JobInfo {
        id: JobId::new(id.to_string()),
        source,
        event_id,
        payload,
        state: decode_state(BACKEND, &state)?,
        attempts,
        lapses,
        last_error,
        history: decode_history(BACKEND, &history)?,
    })
}

#[async_trait]
impl Queue for SqliteQueue {
    async fn enqueue(&self, job: NewJob) -> Result<Enqueued, QueueError> {
        let (answer, mut answered) = oneshot::channel();
        lock(&self.pending).push((job, answer));
        let (pending, retention) = (Arc::clone(&self.pending), millis(self.retention));
        let clock = self.clock.clone();
        // Whoever gets the connection first commits every enqueue waiting
        // by then, this one included; a later turn may find nothing left.
        let turn = self.run(move |conn| {
            let group = std::mem::take(&mut *lock(&pending));
            if !group.is_empty() {
                enqueue_group(conn, group, retention, &clock);
            }
            Ok(())
        });
        // An enqueue answered by someone else's group returns at once
        // instead of queueing for the connection behind later groups; its
        // own turn then finds nothing to do.
        tokio::select! {
            biased;
            answer = &mut answered => return answer.map_err(backend)?,
            ran = turn => ran?,
        }
        answered.await.map_err(backend)?
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Job>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let lease = millis(lease);
        let clock = self.clock.clone();
        self.run(move |conn| {
            let now = clock.now_millis();
            let mut stmt = conn.prepare_cached(&format!(
                "UPDATE inbox_jobs
                 SET state = 'running',
                     attempts = attempts + CASE state WHEN 'running' THEN 0 ELSE 1 END,
                     lapses = lapses + CASE state WHEN 'running' THEN 1 ELSE 0 END,
                     token = randomblob(16), lease_until = ?1 + ?2
                 WHERE id IN (
                     SELECT id FROM inbox_jobs
                     WHERE (state = 'pending' AND run_after <= ?1)
                        OR (state = 'running' AND lease_until <= ?1)
                     ORDER BY run_after, id LIMIT ?3)
                 RETURNING {JOB_COLUMNS}"
            ))?;
            let jobs = stmt
                .query_map(params![now, lease, max], job_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(jobs)
        })
        .await
    }

    async fn heartbeat(&self, job: &Job, lease: Duration) -> Result<Settle, QueueError> {
        self.fenced(
            job,
            "UPDATE inbox_jobs SET lease_until = ?3 + ?4
             WHERE id = ?1 AND token = ?2 AND state = 'running'",
            vec![millis(lease).into()],
        )
        .await
    }

    async fn complete(&self, job: &Job) -> Result<Settle, QueueError> {
        self.fenced(job, COMPLETE, Vec::new()).await
    }

    async fn complete_many(&self, jobs: &[Job]) -> Result<Vec<Settle>, QueueError> {
        let fences: Vec<(i64, Vec<u8>)> = jobs
            .iter()
            .map(|job| (parse_id(&job.id), job.token.as_bytes().to_vec()))
            .collect();
        // One transaction, one commit: each completion is still fenced by
        // its own token.
        let clock = self.clock.clone();
        self.run(move |conn| {
            let tx = conn.transaction()?;
            let now = clock.now_millis();
            let mut settled = Vec::with_capacity(fences.len());
            {
                let mut complete = tx.prepare_cached(COMPLETE)?;
                for (id, token) in &fences {
                    settled.push(match complete.execute(params![id, token, now])? {
                        1 => Settle::Applied,
                        _ => Settle::LeaseLost,
                    });
                }
            }
            tx.commit()?;
            Ok(settled)
        })
        .await
    }

    async fn retry(&self, job: &Job, delay: Duration, error: &str) -> Result<Settle, QueueError> {
        self.fenced(
            job,
            "UPDATE inbox_jobs
             SET state = 'pending', token = NULL, lease_until = NULL, run_after = ?3 + ?5,
                 last_error = ?4,
                 history = json_insert(history, '$[#]',
                     json_object('attempt', attempts, 'error', ?4, 'at_ms', ?3))
             WHERE id = ?1 AND token = ?2 AND state = 'running'",
            vec![error.to_owned().into(), millis(delay).into()],
        )
        .await
    }

    async fn release(&self, job: &Job) -> Result<Settle, QueueError> {
        self.fenced(
            job,
            "UPDATE inbox_jobs
             SET state = 'pending', attempts = max(attempts - 1, 0), token = NULL,
                 lease_until = NULL, run_after = ?3
             WHERE id = ?1 AND token = ?2 AND state = 'running'",
            Vec::new(),
        )
        .await
    }

    async fn dead_letter(&self, job: &Job, error: &str) -> Result<Settle, QueueError> {
        self.fenced(
            job,
            "UPDATE inbox_jobs
             SET state = 'dead', token = NULL, lease_until = NULL, last_error = ?4,
                 history = json_insert(history, '$[#]',
                     json_object('attempt', attempts, 'error', ?4, 'at_ms', ?3))
             WHERE id = ?1 AND token = ?2 AND state = 'running'",
            vec![error.to_owned().into()],
        )
        .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<JobInfo>, QueueError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .run(move |conn| {
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {INFO_COLUMNS} FROM inbox_jobs WHERE state = 'dead' ORDER BY id LIMIT ?1"
                ))?;
                let rows = stmt
                    .query_map(params![limit], info_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(rows)
            })
            .await?;
        rows.into_iter().map(info).collect()
    }

    async fn inspect(&self, id: &JobId) -> Result<Option<JobInfo>, QueueError> {
        let id = parse_id(id);
        let row = self
            .run(move |conn| {
                conn.query_row(
                    &format!("SELECT {INFO_COLUMNS} FROM inbox_jobs WHERE id = ?1"),
                    params![id],
                    info_row,
                )
                .optional()
            })
            .await?;
        row.map(info).transpose()
    }

    async fn requeue(&self, id: &JobId) -> Result<bool, QueueError> {
        let id = parse_id(id);
        let clock = self.clock.clone();
        let changed = self
            .run(move |conn| {
                conn.execute(
                    "UPDATE inbox_jobs SET state = 'pending', attempts = 0, lapses = 0, run_after = ?2
                     WHERE id = ?1 AND state = 'dead'",
                    params![id, clock.now_millis()],
                )
            })
            .await?;
        Ok(changed == 1)
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64, QueueError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let clock = self.clock.clone();
        let deleted = self
            .run(move |conn| {
                // The same rows twice (ordered, in one transaction): a
                // job's dedupe keys go with it.
                let tx = conn.transaction()?;
                let now = clock.now_millis();
                tx.execute(
                    "DELETE FROM inbox_job_keys WHERE job_id IN (
                         SELECT id FROM inbox_jobs
                         WHERE state = 'done' AND dedupe_until <= ?1 ORDER BY id LIMIT ?2)",
                    params![now, limit],
                )?;
                let deleted = tx.execute(
                    "DELETE FROM inbox_jobs WHERE id IN (
                         SELECT id FROM inbox_jobs
                         WHERE state = 'done' AND dedupe_until <= ?1 ORDER BY id LIMIT ?2)",
                    params![now, limit],
                )?;
                tx.commit()?;
                Ok(deleted)
            })
            .await?;
        Ok(deleted as u64)
    }

    async fn depth(&self) -> Result<Option<u64>, QueueError> {
        let depth: i64 = self
            .run(|conn| {
                conn.query_row(
                    "SELECT count(*) FROM inbox_jobs WHERE state IN ('pending', 'running')",
                    [],
                    |row| row.get(0),
                )
            })
            .await?;
        Ok(Some(u64::try_from(depth).unwrap_or(0)))
    }
}
