//! `--inbox`: the webhook inbox's figures.
//!
//! * **Acknowledgement latency**: an `idem-inbox` receiver (axum, Standard
//!   Webhooks) over a SQLite and a PostgreSQL queue, workers stopped, 32
//!   senders each posting signed deliveries of distinct events over
//!   keep-alive connections; p50 and p99 of the time to the 202, measured
//!   at the sender. The target is p99 ≤ 20 ms.
//! * **Worker throughput on PostgreSQL**: `jobs` jobs enqueued, then drained
//!   by idem-inbox's `Worker` (batch claim, handler under `execute` on a
//!   `PostgresStore` in the same database, fenced completion) and by a raw
//!   loop — the textbook `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
//!   LOCKED) RETURNING`, the work, `UPDATE … SET state = 'done'` — both 8
//!   jobs at a time on pools of the same size, doing the same work (none,
//!   and a 2 ms sleep standing for a remote call). Rows alternate within
//!   each repetition; the figure is the median jobs/s and the line
//!   `ratio inbox-jobs work=<w> <worker/raw>`. The target is ≥ 0.9.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_core::Idempotent;
use idem_inbox::queue::{NewJob, PostgresQueue, Queue, SqliteQueue};
use idem_inbox::verify::StandardWebhooks;
use idem_inbox::{Event, HandlerError, Receiver, Worker, WorkerConfig};
use idem_postgres::PostgresStore;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::fixture::BoxError;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SENDERS: usize = 32;
const IN_FLIGHT: usize = 8;
const POOL: u32 = 16;

/// How big a run is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InboxPlan {
    /// Deliveries per acknowledgement run.
    pub(crate) deliveries: usize,
    /// Jobs per throughput run.
    pub(crate) jobs: usize,
    /// Repetitions of each throughput row.
    pub(crate) reps: usize,
}

impl InboxPlan {
    pub(crate) fn new(quick: bool) -> InboxPlan {
        if quick {
            InboxPlan {
                deliveries: 320,
                jobs: 200,
                reps: 1,
            }
        } else {
            InboxPlan {
                deliveries: 6400,
                jobs: 2000,
                reps: 3,
            }
        }
    }
}

/// Runs every inbox measurement and returns the lines to print.
pub(crate) async fn measure(
    postgres_url: &str,
    plan: InboxPlan,
    skipped: &mut Vec<String>,
) -> Result<Vec<String>, BoxError> {
    let mut lines = vec![format!(
        "# inbox: acknowledgement at {SENDERS} senders, workers stopped; worker vs raw SKIP LOCKED, {IN_FLIGHT} in flight"
    )];
    let tag = format!(
        "{}_{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    );
    let dir = tempfile::tempdir()?;
    let sqlite: Arc<dyn Queue> = Arc::new(SqliteQueue::open(dir.path().join("inbox.db")).await?);
    lines.push(ack_line("sqlite", sqlite, plan.deliveries).await?);
    eprintln!("idem-bench: {}", lines[lines.len() - 1]);
    let pool = match PgPoolOptions::new()
        .max_connections(POOL)
        .acquire_timeout(Duration::from_secs(30))
        .connect(postgres_url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => {
            let line = format!(
                "postgres at {postgres_url} is unreachable ({e}); the inbox rows on it are skipped"
            );
            eprintln!("idem-bench: {line}");
            skipped.push(line);
            return Ok(lines);
        }
    };
    let tables = Tables::new(&pool, &tag);
    let result = async {
        let queue = PostgresQueue::from_pool(pool.clone()).with_table(&tables.ack)?;
        queue.migrate().await?;
        lines.push(ack_line("postgres", Arc::new(queue), plan.deliveries).await?);
        eprintln!("idem-bench: {}", lines[lines.len() - 1]);
        for work in [Duration::ZERO, Duration::from_millis(2)] {
            for line in throughput(&pool, &tables, plan, work).await? {
                eprintln!("idem-bench: {line}");
                lines.push(line);
            }
        }
        Ok::<_, BoxError>(())
    }
    .await;
    tables.drop_all().await;
    result.map(|()| lines)
}

/// The table names of one run, dropped at its end.
struct Tables {
    pool: PgPool,
    ack: String,
    jobs: String,
    records: String,
    raw: String,
}

impl Tables {
    fn new(pool: &PgPool, tag: &str) -> Tables {
        Tables {
            pool: pool.clone(),
            ack: format!("bench_inbox_ack_{tag}"),
            jobs: format!("bench_inbox_jobs_{tag}"),
            records: format!("bench_inbox_idem_{tag}"),
            raw: format!("bench_inbox_raw_{tag}"),
        }
    }

    async fn drop_all(&self) {
        for table in [&self.ack, &self.jobs, &self.records, &self.raw] {
            let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                .execute(&self.pool)
                .await;
        }
    }
}

async fn ack_line(
    backend: &str,
    queue: Arc<dyn Queue>,
    deliveries: usize,
) -> Result<String, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let receiver = Receiver::new(backend, StandardWebhooks::new([SECRET])?, queue);
    let server = tokio::spawn(async move { axum::serve(listener, receiver.router()).await });
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(SENDERS)
        .build()?;
    let signer = Arc::new(StandardWebhooks::new([SECRET])?);
    let now = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs())?;
    let started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..SENDERS {
        let (client, url, signer) = (client.clone(), url.clone(), Arc::clone(&signer));
        senders.spawn(async move {
            let mut latencies = Vec::new();
            for n in (sender..deliveries).step_by(SENDERS) {
                let id = format!("evt_{n}");
                let body = format!(r#"{{"n":{n},"type":"invoice.paid"}}"#);
                let signature = signer.sign(&id, now, body.as_bytes());
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .header("webhook-id", &id)
                    .header("webhook-timestamp", now.to_string())
                    .header("webhook-signature", signature)
                    .body(body)
                    .send()
                    .await?;
                let status = response.status();
                response.bytes().await?;
                if status != reqwest::StatusCode::ACCEPTED {
                    return Err(format!("delivery {n} answered {status}").into());
                }
                latencies.push(sent.elapsed());
            }
            Ok::<_, BoxError>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(deliveries);
    while let Some(joined) = senders.join_next().await {
        latencies.extend(joined??);
    }
    let elapsed = started.elapsed();
    server.abort();
    latencies.sort();
    let at = |p: usize| {
        let rank = (latencies.len() * p).div_ceil(100).max(1);
        latencies[rank - 1]
    };
    Ok(format!(
        "inbox-ack {backend} c{SENDERS} n={} p50={:.2}ms p99={:.2}ms acks/s={:.0}",
        latencies.len(),
        at(50).as_secs_f64() * 1e3,
        at(99).as_secs_f64() * 1e3,
        latencies.len() as f64 / elapsed.as_secs_f64()
    ))
}

async fn throughput(
    pool: &PgPool,
    tables: &Tables,
    plan: InboxPlan,
    work: Duration,
) -> Result<Vec<String>, BoxError> {
    let (mut worker, mut raw) = (Vec::new(), Vec::new());
    for rep in 0..plan.reps {
        // Alternate which row goes first, so neither always meets a warmer
        // database.
        for row in if rep % 2 == 0 { [0, 1] } else { [1, 0] } {
            if row == 0 {
                worker.push(worker_run(pool, tables, plan.jobs, work, rep).await?);
            } else {
                raw.push(raw_run(pool, &tables.raw, plan.jobs, work).await?);
            }
        }
    }
    let (worker, raw) = (median(&mut worker), median(&mut raw));
    let ms = work.as_millis();
    Ok(vec![
        format!("inbox-jobs postgres work={ms}ms worker jobs/s={worker:.0}"),
        format!("inbox-jobs postgres work={ms}ms raw-skip-locked jobs/s={raw:.0}"),
        format!("ratio inbox-jobs work={ms}ms {:.3}", worker / raw),
    ])
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Jobs/s of idem-inbox's worker draining `jobs` fresh jobs.
async fn worker_run(
    pool: &PgPool,
    tables: &Tables,
    jobs: usize,
    work: Duration,
    rep: usize,
) -> Result<f64, BoxError> {
    // Fresh queue and records: a record left by the previous repetition
    // would replay instead of running the handler.
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {}; DROP TABLE IF EXISTS {}",
        tables.jobs, tables.records
    ))
    .execute(pool)
    .await?;
    let queue = PostgresQueue::from_pool(pool.clone()).with_table(&tables.jobs)?;
    queue.migrate().await?;
    let store = PostgresStore::from_pool(pool.clone()).with_table(&tables.records)?;
    store.migrate().await?;
    let queue: Arc<dyn Queue> = Arc::new(queue);
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
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(store),
        move |_: Event| {
            let counter = Arc::clone(&counter);
            async move {
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                counter.fetch_add(1, Ordering::Relaxed);
                Ok::<(), HandlerError>(())
            }
        },
    )
    .with_config(
        WorkerConfig::default()
            .with_concurrency(IN_FLIGHT)
            .with_poll(Duration::from_millis(1))
            .with_lease(Duration::from_secs(30)),
    );
    let target = jobs as u64;
    let started = Instant::now();
    // Shutdown once every job was handled; `run` then waits for the last
    // completions, which the measurement includes.
    worker
        .run(async {
            while handled.load(Ordering::Relaxed) < target {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
        .await;
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}

/// Jobs/s of the raw SKIP LOCKED loop draining `jobs` fresh jobs.
async fn raw_run(pool: &PgPool, table: &str, jobs: usize, work: Duration) -> Result<f64, BoxError> {
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
    let started = Instant::now();
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
    Ok(jobs as f64 / started.elapsed().as_secs_f64())
}
