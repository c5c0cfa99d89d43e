//! `execute` against the raw minimal protocol (the bare claim statement and
//! the token-conditioned complete), through one pool on one server, for
//! first executions and replays at concurrency 1 and 32.
//!
//! ```text
//! cargo run --release -p idem-postgres --example postgres_bench
//! ```
//!
//! `IDEM_POSTGRES_URL` picks the server, `BENCH_SECS` the length of one
//! measurement (default 1), `BENCH_ROUNDS` how many rounds of each
//! (default 6), `BENCH_POOL` the pool size (default 16),
//! `BENCH_TEST_BEFORE_ACQUIRE` sqlx's ping before handing out a pooled
//! connection (default true, sqlx's default).
//!
//! Other work on the machine moves throughput a lot between seconds, so
//! each round measures raw and `execute` back to back, in alternating
//! order, and the ratio printed is the median of the rounds' ratios. The
//! client CPU time per operation (from `/proc/self/stat`) shows the cost
//! idem itself adds, free of that noise.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Fingerprint, Idempotent, Token};
use idem_postgres::raw::{self, Claimed};
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::{sqlx, PostgresStore};

const LEASE: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(3600);

type Op = Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// This process's user + system CPU time, in clock ticks (1/100 s).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// What one measurement saw.
#[derive(Clone, Copy)]
struct Sample {
    per_sec: f64,
    cpu_us_per_op: f64,
}

/// Runs `op(i)` for i = 0, 1, … from `concurrency` tasks for `secs`.
async fn measure(concurrency: usize, secs: f64, op: &Op) -> (Sample, usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let (began, ticks) = (Instant::now(), cpu_ticks());
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (op, next) = (Arc::clone(op), Arc::clone(&next));
            tokio::spawn(async move {
                while Instant::now() < until {
                    op(next.fetch_add(1, Ordering::Relaxed)).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a benchmark task panicked");
    }
    let ops = next.load(Ordering::Relaxed);
    let cpu_us = (cpu_ticks() - ticks) as f64 * 10_000.0;
    let sample = Sample {
        per_sec: ops as f64 / began.elapsed().as_secs_f64(),
        cpu_us_per_op: cpu_us / ops.max(1) as f64,
    };
    (sample, ops)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

struct Setup {
    store: PostgresStore,
    idem: Idempotent,
    payload: Arc<Vec<u8>>,
    outcome: String,
    body: serde_json::Value,
    fingerprint: [u8; 32],
}

impl Setup {
    fn raw_first(&self, prefix: &str) -> Op {
        let (store, payload, fingerprint) = (
            self.store.clone(),
            Arc::clone(&self.payload),
            self.fingerprint,
        );
        let prefix = prefix.to_owned();
        Arc::new(move |i| {
            let (store, payload) = (store.clone(), Arc::clone(&payload));
            let key = format!("raw-{prefix}-{i}");
            Box::pin(async move {
                let token = *Token::random().as_bytes();
                let claimed = raw::claim(&store, &key, &token, &fingerprint, LEASE, RETENTION)
                    .await
                    .expect("raw claim");
                assert_eq!(claimed, Claimed::Inserted);
                let done = raw::complete(&store, &key, &token, &fingerprint, &payload, RETENTION)
                    .await
                    .expect("raw complete");
                assert!(done);
            })
        })
    }

    fn raw_replay(&self, prefix: &str, keys: usize) -> Op {
        let (store, fingerprint) = (self.store.clone(), self.fingerprint);
        let prefix = prefix.to_owned();
        Arc::new(move |i| {
            let store = store.clone();
            let key = format!("raw-{prefix}-{}", i % keys);
            Box::pin(async move {
                let token = *Token::random().as_bytes();
                match raw::claim(&store, &key, &token, &fingerprint, LEASE, RETENTION)
                    .await
                    .expect("raw claim")
                {
                    Claimed::Found { state: 1, payload } => assert_eq!(payload.len(), 100),
                    other => panic!("expected a completed record, got {other:?}"),
                }
            })
        })
    }

    fn execute(&self, prefix: &str, keys: Option<usize>) -> Op {
        let (idem, outcome, body) = (self.idem.clone(), self.outcome.clone(), self.body.clone());
        let prefix = prefix.to_owned();
        Arc::new(move |i| {
            let (idem, outcome, body) = (idem.clone(), outcome.clone(), body.clone());
            let key = format!("idem-{prefix}-{}", keys.map_or(i, |keys| i % keys));
            Box::pin(async move {
                let value: String = idem
                    .execute(&key, &body, || async move {
                        // A replay must never get here.
                        keys.map_or(Ok(outcome), |_| Err("a replay ran the work".to_owned()))
                    })
                    .await
                    .expect("execute");
                assert_eq!(value.len(), 98);
            })
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned());
    let secs: f64 = env("BENCH_SECS", 1.0);
    let rounds: usize = env("BENCH_ROUNDS", 6);
    let pool_size: u32 = env("BENCH_POOL", 16);
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .test_before_acquire(env("BENCH_TEST_BEFORE_ACQUIRE", true))
        .connect(&url)
        .await?;
    let table = format!("idem_bench_{}", std::process::id());
    let store = PostgresStore::from_pool(pool.clone()).with_table(&table)?;
    store.migrate().await?;
    // A 100-byte outcome either way: 98 characters and their JSON quotes.
    let outcome = "o".repeat(98);
    let body = serde_json::json!({"amount": 1250, "currency": "EUR"});
    let setup = Setup {
        idem: Idempotent::new(store.clone())
            .with_lease(LEASE)
            .with_retention(RETENTION),
        store,
        payload: Arc::new(serde_json::to_vec(&outcome)?),
        fingerprint: *Fingerprint::of_json(&body)?.as_bytes(),
        outcome,
        body,
    };
    assert_eq!(setup.payload.len(), 100);

    println!("postgres, pool {pool_size}, {rounds} rounds of {secs} s; medians");
    println!(
        "{:<7} {:>4} {:>9} {:>9} {:>6}   client CPU us/op raw / execute",
        "", "conc", "raw/s", "execute/s", "ratio"
    );
    let mut generation = 0;
    for concurrency in [1_usize, 32] {
        let mut first: Vec<(Sample, Sample)> = Vec::new();
        let mut replay: Vec<(Sample, Sample)> = Vec::new();
        for round in 0..rounds {
            generation += 1;
            // Every round claims keys no earlier round used.
            let prefix = format!("g{generation}");
            let raw_op = setup.raw_first(&prefix);
            let idem_op = setup.execute(&prefix, None);
            let ((raw, raw_keys), (idem, idem_keys)) = if round % 2 == 0 {
                let raw = measure(concurrency, secs, &raw_op).await;
                (raw, measure(concurrency, secs, &idem_op).await)
            } else {
                let idem = measure(concurrency, secs, &idem_op).await;
                (measure(concurrency, secs, &raw_op).await, idem)
            };
            first.push((raw, idem));
            // Replays cycle over the keys this round completed.
            let raw_op = setup.raw_replay(&prefix, raw_keys.max(1));
            let idem_op = setup.execute(&prefix, Some(idem_keys.max(1)));
            let (raw, idem) = if round % 2 == 0 {
                let raw = measure(concurrency, secs, &raw_op).await.0;
                (raw, measure(concurrency, secs, &idem_op).await.0)
            } else {
                let idem = measure(concurrency, secs, &idem_op).await.0;
                (measure(concurrency, secs, &raw_op).await.0, idem)
            };
            replay.push((raw, idem));
        }
        for (name, samples) in [("first", first), ("replay", replay)] {
            let med =
                |f: &dyn Fn(&(Sample, Sample)) -> f64| median(samples.iter().map(f).collect());
            println!(
                "{name:<7} {concurrency:>4} {:>9.0} {:>9.0} {:>6.3}   {:.0} / {:.0}",
                med(&|(raw, _)| raw.per_sec),
                med(&|(_, idem)| idem.per_sec),
                med(&|(raw, idem)| idem.per_sec / raw.per_sec),
                med(&|(raw, _)| raw.cpu_us_per_op),
                med(&|(_, idem)| idem.cpu_us_per_op),
            );
        }
    }
    sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await?;
    Ok(())
}
