//! inbox-bench: the webhook inbox's figures.
//!
//! * **Acknowledgement latency**: an `idem-inbox` receiver (axum, Standard
//!   Webhooks) over a SQLite and a PostgreSQL queue, workers stopped, 32
//!   senders each posting signed deliveries of distinct events over
//!   keep-alive connections; p50 and p99 of the time to the 202, measured
//!   at the sender. The target is p99 ≤ 20 ms.
//! * **Worker throughput** on SQLite and PostgreSQL against a raw loop
//!   doing the same work: see [`crate::inbox_jobs`].

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_inbox::queue::{PostgresQueue, Queue, SqliteQueue};
use idem_inbox::verify::StandardWebhooks;
use idem_inbox::Receiver;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::fixture::BoxError;
use crate::inbox_jobs::{throughput, Bed, IN_FLIGHT};

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SENDERS: usize = 32;
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
    /// The full run's sizes, or the quick run's.
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
        "# inbox: acknowledgement at {SENDERS} senders, workers stopped; worker vs raw claim loop, {IN_FLIGHT} in flight"
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
    for work in [Duration::ZERO, Duration::from_millis(2)] {
        for line in throughput(Bed::Sqlite, plan, work).await? {
            eprintln!("idem-bench: {line}");
            lines.push(line);
        }
    }
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
            let bed = Bed::Postgres {
                pool: &pool,
                tables: &tables,
            };
            for line in throughput(bed, plan, work).await? {
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

/// The inbox tables of `BENCHMARKS.md`, read from the lines [`measure`]
/// returns: the receiver's acknowledgement at 32 senders, then the worker
/// against the raw claim loop per backend and work per job.
pub(crate) fn markdown(lines: &[String]) -> String {
    let field = |line: &str, name: &str| -> String {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or("-")
            .to_owned()
    };
    let mut acks = crate::markdown::Table::new(&[
        "receiver on",
        ">senders",
        ">ack p50 ms",
        ">ack p99 ms",
        ">acks/s",
    ]);
    let mut jobs = crate::markdown::Table::new(&[
        "worker on",
        "work per job",
        ">worker jobs/s",
        ">raw loop jobs/s",
        ">worker ÷ raw",
    ]);
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["inbox-ack", backend, senders, ..] => acks.row(vec![
                (*backend).to_owned(),
                senders.trim_start_matches('c').to_owned(),
                field(line, "p50=").trim_end_matches("ms").to_owned(),
                field(line, "p99=").trim_end_matches("ms").to_owned(),
                crate::report::thousands(field(line, "acks/s=").parse().unwrap_or(f64::NAN)),
            ]),
            ["ratio", "inbox-jobs", backend, work, ratio] => {
                let work = work.trim_start_matches("work=");
                let rate = |who: &str, backend: &str| {
                    lines
                        .iter()
                        .find(|l| {
                            l.starts_with(&format!("inbox-jobs {backend} work={work} {who} "))
                        })
                        .map_or("-".to_owned(), |l| {
                            crate::report::thousands(
                                field(l, "jobs/s=").parse().unwrap_or(f64::NAN),
                            )
                        })
                };
                let raw_backend = backend.trim_end_matches("-shared");
                jobs.row(vec![
                    (*backend).to_owned(),
                    work.to_owned(),
                    rate("worker", backend),
                    rate("raw", raw_backend),
                    format!("{:.2}", ratio.parse::<f64>().unwrap_or(f64::NAN)),
                ]);
            }
            _ => {}
        }
    }
    format!("{}\n{}", acks.render(), jobs.render())
}

/// The table names of one run, dropped at its end.
pub(crate) struct Tables {
    pool: PgPool,
    ack: String,
    pub(crate) jobs: String,
    pub(crate) records: String,
    pub(crate) raw: String,
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
