//! inbox-bench's throughput rows: jobs/s through idem-inbox's `Worker`
//! against a raw claim-and-mark-done loop doing the same work, on the same
//! backend in the same run.
//!
//! * **PostgreSQL**: the worker (batch claim, the handler under `execute`
//!   on a `PostgresStore` in the same database, grouped fenced
//!   completions) against the textbook `UPDATE … WHERE id IN (SELECT …
//!   FOR UPDATE SKIP LOCKED) RETURNING`, the work, `UPDATE … SET state =
//!   'done'`.
//!   With `PostgresQueue::with_store`, the `postgres-shared` row: the same
//!   worker, its queue claiming each batch of jobs with idem's claims of
//!   their keys in one commit.
//! * **SQLite**: the worker over a `SqliteQueue` and a `SqliteStore`
//!   (each its own file, WAL, full synchronous commits) against the same
//!   claim-one, work, mark-done loop on one connection with the same
//!   settings — SQLite has one writer, so its raw equivalent of `SKIP
//!   LOCKED` is a plain `UPDATE … RETURNING` under its write lock.
//!
//! The worker prefetches `IN_FLIGHT` jobs (`WorkerConfig::with_prefetch`;
//! the default is none), as a throughput-minded deployment would. Both
//! sides run `IN_FLIGHT` jobs at a time and do the same work (none,
//! and a 2 ms sleep standing for a remote call). Rows alternate within
//! each repetition; the figure is the median jobs/s and the line `ratio
//! inbox-jobs <backend> work=<w> <worker/raw>`. The target is ≥ 0.9.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::Idempotent;
use idem_inbox::queue::{NewJob, PostgresQueue, Queue, SqliteQueue};
use idem_inbox::{Event, HandlerError, Worker, WorkerConfig};
use idem_postgres::PostgresStore;
use idem_sqlite::SqliteStore;
use rusqlite::{params, Connection, OptionalExtension};
use sqlx::PgPool;

use crate::fixture::BoxError;
use crate::inbox::{InboxPlan, Tables};

/// Jobs each side runs at once.
pub(crate) const IN_FLIGHT: usize = 8;

/// Where a throughput row runs.
#[derive(Clone, Copy)]
pub(crate) enum Bed<'a> {
    Postgres {
        pool: &'a PgPool,
        tables: &'a Tables,
    },
    Sqlite,
}

impl Bed<'_> {
    fn name(self) -> &'static str {
        match self {
            Bed::Postgres { .. } => "postgres",
            Bed::Sqlite => "sqlite",
        }
    }
}

/// The worker and raw rows on `bed`, and their ratio; on PostgreSQL also
/// the worker whose queue claims idem's keys in its own commits
/// (`PostgresQueue::with_store`), as `postgres-shared`.
pub(crate) async fn throughput(
    bed: Bed<'_>,
    plan: InboxPlan,
    work: Duration,
) -> Result<Vec<String>, BoxError> {
    let rows: &[Row] = match bed {
        Bed::Postgres { .. } => &[Row::Worker, Row::Raw, Row::Shared],
        Bed::Sqlite => &[Row::Worker, Row::Raw],
    };
    let mut samples = vec![Vec::new(); rows.len()];
    for rep in 0..plan.reps {
        // Rotate which row goes first, so none always meets a warmer
        // database.
        for n in 0..rows.len() {
            let at = (n + rep) % rows.len();
            let sample = match rows[at] {
                Row::Worker => worker_run(bed, plan.jobs, work, rep, false).await?,
                Row::Shared => worker_run(bed, plan.jobs, work, rep, true).await?,
                Row::Raw => raw_run(bed, plan.jobs, work).await?,
            };
            samples[at].push(sample);
        }
    }
    let rows: Vec<(f64, String)> = samples
        .iter_mut()
        .map(|samples| {
            let mut rates: Vec<f64> = samples.iter().map(|(rate, _)| *rate).collect();
            let cpu = |pick: fn(&CpuPerJob) -> Option<f64>| {
                let mut values: Vec<f64> = samples.iter().filter_map(|(_, c)| pick(c)).collect();
                (!values.is_empty()).then(|| median(&mut values))
            };
            let mut cpu_text = String::new();
            if let Some(client) = cpu(|c| c.0) {
                cpu_text += &format!(" client-cpu-us/job={client:.0}");
            }
            // SQLite runs in this process: no server to count.
            let server = match bed {
                Bed::Postgres { .. } => cpu(|c| c.1),
                Bed::Sqlite => None,
            };
            if let Some(server) = server {
                cpu_text += &format!(" server-cpu-us/job={server:.0}");
            }
            (median(&mut rates), cpu_text)
        })
        .collect();
    let (ms, name) = (work.as_millis(), bed.name());
    let ((worker, worker_cpu), (raw, raw_cpu)) = (&rows[0], &rows[1]);
    let mut lines = vec![
        format!("inbox-jobs {name} work={ms}ms worker jobs/s={worker:.0}{worker_cpu}"),
        format!("inbox-jobs {name} work={ms}ms raw jobs/s={raw:.0}{raw_cpu}"),
        format!("ratio inbox-jobs {name} work={ms}ms {:.3}", worker / raw),
    ];
    if let Some((shared, shared_cpu)) = rows.get(2) {
        lines.push(format!(
            "inbox-jobs {name}-shared work={ms}ms worker jobs/s={shared:.0}{shared_cpu}"
        ));
        lines.push(format!(
            "ratio inbox-jobs {name}-shared work={ms}ms {:.3}",
            shared / raw
        ));
    }
    Ok(lines)
}

/// A row's jobs/s and its client and server CPU per job (µs), taken over
/// the timed part only (not the set-up's enqueues).
type Sample = (f64, CpuPerJob);

/// Client and server CPU per job, µs, where known.
type CpuPerJob = (Option<f64>, Option<f64>);

/// CPU used so far by this process (the client: the worker or the raw
/// loop, and an in-process SQLite) and by the local PostgreSQL server's
/// processes, from `/proc` (Linux; `None` elsewhere).
struct Cpu {
    client: Option<Duration>,
    server: Option<Duration>,
}

impl Cpu {
    fn now() -> Cpu {
        Cpu {
            client: crate::runner::process_cpu(),
            server: postgres_cpu(),
        }
    }

    /// Microseconds of client and server CPU per job since `self`.
    fn per_job(&self, jobs: usize) -> CpuPerJob {
        let now = Cpu::now();
        let per_job = |before: Option<Duration>, after: Option<Duration>| {
            let used = after?.checked_sub(before?)?;
            Some(used.as_secs_f64() * 1e6 / jobs as f64)
        };
        (
            per_job(self.client, now.client),
            per_job(self.server, now.server).filter(|us| *us > 0.0),
        )
    }
}

/// CPU used so far by every process named `postgres` on this machine (the
/// server and its backends; one that exits takes its share with it).
fn postgres_cpu() -> Option<Duration> {
    let mut ticks = 0u64;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != "postgres" {
            continue;
        }
        let mut fields = stat[close + 1..].split_whitespace().skip(11);
        let user: u64 = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
        let system: u64 = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
        ticks += user + system;
    }
    (ticks > 0).then(|| Duration::from_millis(ticks * 10))
}

#[derive(Clone, Copy)]
enum Row {
    /// The worker, idem's records apart from the queue's commits.
    Worker,
    /// The raw claim-and-mark-done loop.
    Raw,
    /// The worker, idem's claims in the queue's commits.
    Shared,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Jobs/s of idem-inbox's worker draining `jobs` fresh jobs.
async fn worker_run(
    bed: Bed<'_>,
    jobs: usize,
    work: Duration,
    rep: usize,
    shared: bool,
) -> Result<Sample, BoxError> {
    // Fresh queue and records: a record left by the previous repetition
    // would replay instead of running the handler.
    let dir = tempfile::tempdir()?;
    let (queue, idem): (Arc<dyn Queue>, Idempotent) = match bed {
        Bed::Postgres { pool, tables } => {
            sqlx::raw_sql(&format!(
                "DROP TABLE IF EXISTS {}; DROP TABLE IF EXISTS {}",
                tables.jobs, tables.records
            ))
            .execute(pool)
            .await?;
            let store = PostgresStore::from_pool(pool.clone()).with_table(&tables.records)?;
            store.migrate().await?;
            let queue = PostgresQueue::from_pool(pool.clone()).with_table(&tables.jobs)?;
            let queue = if shared {
                queue.with_store(store.clone())
            } else {
                queue
            };
            queue.migrate().await?;
            (Arc::new(queue), Idempotent::new(store))
        }
        Bed::Sqlite => {
            let queue = SqliteQueue::open(dir.path().join("queue.db")).await?;
            let store = SqliteStore::open(dir.path().join("idem.db")).await?;
            (Arc::new(queue), Idempotent::new(store))
        }
    };
    let mut enqueues = tokio::task::JoinSet::new();
    for chunk in 0..16 {
        let queue = Arc::clone(&queue);
        enqueues.spawn(async move {
            for n in (chunk..jobs).step_by(16) {
                queue
                    .enqueue(NewJob::new("bench", format!("r{rep}_{n}"), b"{}".to_vec()))
                    .await?;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(joined) = enqueues.join_next().await {
        joined??;
    }
    let handled = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&handled);
    let worker = Worker::new(Arc::clone(&queue), idem, move |_: Event| {
        let counter = Arc::clone(&counter);
        async move {
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            counter.fetch_add(1, Ordering::Relaxed);
            Ok::<(), HandlerError>(())
        }
    })
    .with_config(
        WorkerConfig::default()
            .with_concurrency(IN_FLIGHT)
            .with_prefetch(IN_FLIGHT)
            .with_poll(Duration::from_millis(1))
            .with_lease(Duration::from_secs(30)),
    );
    let target = jobs as u64;
    let (started, cpu) = (Instant::now(), Cpu::now());
    // Shutdown once every job was handled; `run` then waits for the last
    // completions, which the measurement includes.
    worker
        .run(async {
            while handled.load(Ordering::Relaxed) < target {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
        .await;
    let (rate, cpu) = (
        jobs as f64 / started.elapsed().as_secs_f64(),
        cpu.per_job(jobs),
    );
    let left = queue.depth().await?;
    if left != Some(0) {
        return Err(format!("the worker left {left:?} jobs unfinished").into());
    }
    Ok((rate, cpu))
}

/// Jobs/s of the raw loop draining `jobs` fresh jobs.
async fn raw_run(bed: Bed<'_>, jobs: usize, work: Duration) -> Result<Sample, BoxError> {
    match bed {
        Bed::Postgres { pool, tables } => raw_postgres(pool, &tables.raw, jobs, work).await,
        Bed::Sqlite => {
            let dir = tempfile::tempdir()?;
            raw_sqlite(&dir.path().join("raw.db"), jobs, work).await
        }
    }
}

async fn raw_postgres(
    pool: &PgPool,
    table: &str,
    jobs: usize,
    work: Duration,
) -> Result<Sample, BoxError> {
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {table};
         CREATE TABLE {table} (id bigserial PRIMARY KEY, payload bytea NOT NULL,
             state text NOT NULL DEFAULT 'pending', attempts int NOT NULL DEFAULT 0,
             run_after timestamptz NOT NULL DEFAULT now(), locked_until timestamptz);
         CREATE INDEX ON {table} (run_after) WHERE state = 'pending';"
    ))
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO {table} (payload) SELECT '\\x7b7d'::bytea FROM generate_series(1, $1)"
    ))
    .bind(i64::try_from(jobs)?)
    .execute(pool)
    .await?;
    let claim = Arc::new(format!(
        "UPDATE {table} SET state = 'running', attempts = attempts + 1,
             locked_until = now() + interval '30 seconds'
         WHERE id IN (SELECT id FROM {table} WHERE state = 'pending' AND run_after <= now()
                      ORDER BY run_after LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING id, payload"
    ));
    let done = Arc::new(format!("UPDATE {table} SET state = 'done' WHERE id = $1"));
    let (started, cpu) = (Instant::now(), Cpu::now());
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (pool, claim, done) = (pool.clone(), Arc::clone(&claim), Arc::clone(&done));
        loops.spawn(async move {
            loop {
                let row: Option<(i64, Vec<u8>)> =
                    sqlx::query_as(&claim).fetch_optional(&pool).await?;
                let Some((id, _payload)) = row else {
                    return Ok::<_, BoxError>(());
                };
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                sqlx::query(&done).bind(id).execute(&pool).await?;
            }
        });
    }
    while let Some(joined) = loops.join_next().await {
        joined??;
    }
    Ok((
        jobs as f64 / started.elapsed().as_secs_f64(),
        cpu.per_job(jobs),
    ))
}

async fn raw_sqlite(path: &Path, jobs: usize, work: Duration) -> Result<Sample, BoxError> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY, payload BLOB NOT NULL,
             state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0,
             run_after INTEGER NOT NULL DEFAULT 0, locked_until INTEGER);
         CREATE INDEX jobs_due ON jobs (state, run_after);",
    )?;
    {
        let tx = conn.unchecked_transaction()?;
        for _ in 0..jobs {
            tx.execute("INSERT INTO jobs (payload) VALUES (x'7b7d')", [])?;
        }
        tx.commit()?;
    }
    // One connection used one operation at a time off the async threads,
    // as `SqliteQueue` uses its own.
    let conn = Arc::new(Mutex::new(conn));
    let (started, cpu) = (Instant::now(), Cpu::now());
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let conn = Arc::clone(&conn);
        loops.spawn(async move {
            loop {
                let claim = Arc::clone(&conn);
                let row = tokio::task::spawn_blocking(move || {
                    let conn = claim.lock().unwrap_or_else(|p| p.into_inner());
                    let row = conn
                        .prepare_cached(
                            "UPDATE jobs SET state = 'running', attempts = attempts + 1,
                             locked_until = ?1 + 30000
                         WHERE id IN (SELECT id FROM jobs WHERE state = 'pending'
                                      AND run_after <= ?1 ORDER BY run_after LIMIT 1)
                         RETURNING id, payload",
                        )?
                        .query_row(params![now_ms()], |row| {
                            Ok((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?))
                        })
                        .optional();
                    row
                })
                .await??;
                let Some((id, _payload)) = row else {
                    return Ok::<_, BoxError>(());
                };
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                let done = Arc::clone(&conn);
                tokio::task::spawn_blocking(move || {
                    let conn = done.lock().unwrap_or_else(|p| p.into_inner());
                    let done = conn
                        .prepare_cached("UPDATE jobs SET state = 'done' WHERE id = ?1")?
                        .execute(params![id]);
                    done
                })
                .await??;
            }
        });
    }
    while let Some(joined) = loops.join_next().await {
        joined??;
    }
    Ok((
        jobs as f64 / started.elapsed().as_secs_f64(),
        cpu.per_job(jobs),
    ))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
