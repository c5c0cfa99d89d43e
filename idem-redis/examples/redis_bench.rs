//! `execute` against the raw minimal protocol done by hand, on the same
//! Redis connection: first executions and replays at concurrency 1 and 32.
//!
//! ```text
//! cargo run --release -p idem-redis --example redis_bench
//! ```
//!
//! Three contenders, alternating in slices so that load from other
//! processes hits all alike (rates are over all slices):
//!
//! * `raw`: claim with `SET … NX GET PX`, complete with a compare-and-set
//!   script (see `idem_redis::raw`);
//! * `raw+ttl`: the same, with the claim's `PTTL` read in one `MULTI … EXEC`:
//!   what reporting the time left, as the store contract asks, costs;
//! * `execute`: `Idempotent::execute` on a `RedisStore`, trivial work, a
//!   100-byte outcome.
//!
//! `÷raw` and `÷ttl` are execute's rate over the others'. CPU columns are
//! microseconds per operation, this process (client) + the Redis server
//! (`INFO cpu`, so run it on a server nobody else uses for clean figures).
//!
//! Reads `IDEM_REDIS_URL` (default `redis://127.0.0.1:6379`),
//! `IDEM_BENCH_SECS` (per slice, default 1), `IDEM_BENCH_ROUNDS` (default
//! 5) and `IDEM_BENCH_ONLY` (one workload, such as `replay 32`). Writes only
//! under a fresh prefix, deleted at the end.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Fingerprint, Idempotent};
use idem_redis::raw::{RawClaim, RawProtocol};
use idem_redis::redis::aio::MultiplexedConnection;
use idem_redis::redis::AsyncCommands;
use idem_redis::RedisStore;

const LEASE: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(600);
const REPLAY_KEYS: usize = 1000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Operations, wall time and CPU time of this process (client) and of the
/// Redis server during one measurement.
#[derive(Default)]
struct Sample {
    ops: f64,
    secs: f64,
    client_cpu: f64,
    server_cpu: f64,
}

impl Sample {
    fn add(&mut self, other: &Sample) {
        self.ops += other.ops;
        self.secs += other.secs;
        self.client_cpu += other.client_cpu;
        self.server_cpu += other.server_cpu;
    }

    fn rate(&self) -> f64 {
        self.ops / self.secs
    }

    fn cpu(&self) -> String {
        let per_op = |cpu: f64| cpu * 1e6 / self.ops;
        format!(
            "{:.1} + {:.1}",
            per_op(self.client_cpu),
            per_op(self.server_cpu)
        )
    }
}

/// CPU seconds this process has used, all threads.
fn client_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and
    // stime are the 12th and 13th, in clock ticks of 1/100 s.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<f64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    fields
        .get(11)
        .zip(fields.get(12))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
}

/// CPU seconds the Redis server has used, from `INFO cpu`.
async fn server_cpu(admin: &mut MultiplexedConnection) -> f64 {
    let info: String = idem_redis::redis::cmd("INFO")
        .arg("cpu")
        .query_async(admin)
        .await
        .unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let value = line
                .strip_prefix("used_cpu_user:")
                .or_else(|| line.strip_prefix("used_cpu_sys:"))?;
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

/// Runs `op(i)` for i = 0, 1, … from `concurrency` tasks for `secs`.
async fn measure<F, Fut>(
    admin: &mut MultiplexedConnection,
    concurrency: usize,
    secs: f64,
    op: F,
) -> Sample
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let (client_before, server_before) = (client_cpu(), server_cpu(admin).await);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (op, next) = (Arc::clone(&op), Arc::clone(&next));
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
    let secs = start.elapsed().as_secs_f64();
    Sample {
        ops: next.load(Ordering::Relaxed) as f64,
        secs,
        client_cpu: client_cpu() - client_before,
        server_cpu: server_cpu(admin).await - server_before,
    }
}

/// One operation of the raw protocol: claim, then complete or replay.
async fn raw_op(
    raw: &RawProtocol,
    key: &str,
    fingerprint: &Fingerprint,
    payload: &[u8],
    with_ttl: bool,
) {
    let claim = if with_ttl {
        raw.claim_with_ttl(key, fingerprint, LEASE).await.unwrap().0
    } else {
        raw.claim(key, fingerprint, LEASE).await.unwrap()
    };
    match claim {
        RawClaim::Claimed(token) => {
            let done = raw
                .complete(key, token, fingerprint, payload, RETENTION)
                .await
                .unwrap();
            assert!(done, "raw complete lost its claim");
        }
        RawClaim::Replay(found) => assert_eq!(found.len(), 100),
        other => panic!("raw claim found {other:?}"),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    First,
    Replay,
}

#[tokio::main]
async fn main() {
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let secs: f64 = env_or("IDEM_BENCH_SECS", 1.0);
    let rounds: usize = env_or("IDEM_BENCH_ROUNDS", 5);
    // One workload only, such as "replay 32", for profiling.
    let only: String = env_or("IDEM_BENCH_ONLY", String::new());
    let prefix = format!("idem-bench:{:016x}:", rand::random::<u64>());
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("cannot reach Redis at {url}: {e}"))
        .with_prefix(&prefix);
    let raw = RawProtocol::new(&store);
    // A separate connection for INFO and cleanup, so that it never queues
    // behind the measured traffic.
    let mut admin = idem_redis::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let idem = Idempotent::new(store.clone())
        .with_lease(LEASE)
        .with_retention(RETENTION);

    let body = serde_json::json!({ "amount": 1250, "currency": "EUR" });
    let outcome = "x".repeat(98);
    let payload: Arc<[u8]> = serde_json::to_vec(&outcome).unwrap().into();
    assert_eq!(payload.len(), 100);
    let fingerprint = Fingerprint::of_json(&body).unwrap();

    // Keys both sides replay from, recorded once up front.
    for i in 0..REPLAY_KEYS {
        let key = format!("replay-{i}");
        let _: String = idem
            .execute(&key, &body, || async {
                Ok::<_, Infallible>(outcome.clone())
            })
            .await
            .unwrap();
        let RawClaim::Claimed(token) = raw.claim(&key, &fingerprint, LEASE).await.unwrap() else {
            panic!("raw replay key {key} was taken");
        };
        raw.complete(&key, token, &fingerprint, &payload, RETENTION)
            .await
            .unwrap();
    }

    println!("Redis at {url}; raw, raw+ttl and execute alternate {rounds} times, {secs} s each");
    println!(
        "{:<16} {:>5} {:>9} {:>9} {:>9} {:>6} {:>6}   {:>12} {:>12} {:>12}",
        "workload",
        "conc",
        "raw/s",
        "raw+ttl/s",
        "execute/s",
        "÷raw",
        "÷ttl",
        "raw cpu",
        "raw+ttl cpu",
        "execute cpu"
    );
    for mode in [Mode::First, Mode::Replay] {
        for concurrency in [1, 32] {
            let name = match mode {
                Mode::First => "first execution",
                Mode::Replay => "replay",
            };
            if !only.is_empty() && only != format!("{name} {concurrency}") {
                continue;
            }
            let mut raw_total = Sample::default();
            let mut ttl_total = Sample::default();
            let mut idem_total = Sample::default();
            for round in 0..rounds {
                let tag = format!("{concurrency}-{round}");
                let raw_sample = {
                    let (raw, payload, tag) = (raw.clone(), Arc::clone(&payload), tag.clone());
                    measure(&mut admin, concurrency, secs, move |i| {
                        let (raw, payload) = (raw.clone(), Arc::clone(&payload));
                        let key = match mode {
                            Mode::First => format!("raw-{tag}-{i}"),
                            Mode::Replay => format!("replay-{}", i % REPLAY_KEYS),
                        };
                        async move { raw_op(&raw, &key, &fingerprint, &payload, false).await }
                    })
                    .await
                };
                let ttl_sample = {
                    let (raw, payload, tag) = (raw.clone(), Arc::clone(&payload), tag.clone());
                    measure(&mut admin, concurrency, secs, move |i| {
                        let (raw, payload) = (raw.clone(), Arc::clone(&payload));
                        let key = match mode {
                            Mode::First => format!("ttl-{tag}-{i}"),
                            Mode::Replay => format!("replay-{}", i % REPLAY_KEYS),
                        };
                        async move { raw_op(&raw, &key, &fingerprint, &payload, true).await }
                    })
                    .await
                };
                let idem_sample = {
                    let (idem, body, outcome) = (idem.clone(), body.clone(), outcome.clone());
                    measure(&mut admin, concurrency, secs, move |i| {
                        let (idem, body, outcome) = (idem.clone(), body.clone(), outcome.clone());
                        let key = match mode {
                            Mode::First => format!("idem-{tag}-{i}"),
                            Mode::Replay => format!("replay-{}", i % REPLAY_KEYS),
                        };
                        async move {
                            let got: String = idem
                                .execute(&key, &body, || async { Ok::<_, Infallible>(outcome) })
                                .await
                                .unwrap();
                            assert_eq!(got.len(), 98);
                        }
                    })
                    .await
                };
                raw_total.add(&raw_sample);
                ttl_total.add(&ttl_sample);
                idem_total.add(&idem_sample);
            }
            println!(
                "{name:<16} {concurrency:>5} {:>9.0} {:>9.0} {:>9.0} {:>6.2} {:>6.2}   {:>12} {:>12} {:>12}",
                raw_total.rate(),
                ttl_total.rate(),
                idem_total.rate(),
                idem_total.rate() / raw_total.rate(),
                idem_total.rate() / ttl_total.rate(),
                raw_total.cpu(),
                ttl_total.cpu(),
                idem_total.cpu(),
            );
        }
    }

    let mut redis = admin;
    // Cleanup: the bench's keys only, never a flush.
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = idem_redis::redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut redis)
            .await
            .unwrap();
        if !keys.is_empty() {
            let () = redis.unlink(keys).await.unwrap();
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}
