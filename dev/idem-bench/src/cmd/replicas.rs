//! `replica-bench`: what `RedisStore::with_replica_acks` costs.
//!
//! `cargo run --release -p idem-bench --bin replica-bench -- --help`

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idem_core::Idempotent;
use idem_redis::RedisStore;
use idem_testing::process::{free_port, redis_server, Process};

use crate::cli;
use crate::stats::median;

/// Starts its own Redis master and one replica (`redis-server` on free
/// loopback ports, no persistence) and measures first executions and
/// replays per second through one store that waits for the replica's
/// acknowledgement of every write (`with_replica_acks(1, 400 ms)`: below
/// the 500 ms response timeout of `connect`'s connection) and one
/// that does not, in alternating rounds on the same servers; medians.
#[derive(Debug, Parser)]
#[command(name = "replica-bench", version)]
struct Args {
    /// A short run for CI: one round of 200 ms a row, 1 and 8 callers.
    #[arg(long)]
    quick: bool,

    /// Rounds per row; the median is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,

    /// Length of one round, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    duration_ms: u64,

    /// Concurrent callers, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    callers: Vec<usize>,
}

/// A data server on `port`, a replica of `master` when given.
fn server(dir: &std::path::Path, port: u16, master: Option<u16>) -> Result<Process, String> {
    let mut extra = vec!["--repl-diskless-sync-delay".to_owned(), "0".to_owned()];
    if let Some(master) = master {
        extra.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
    }
    redis_server(dir, port, &extra).map_err(|e| format!("redis-server: {e}"))
}

/// Waits until the replica on `port` has synced with its master.
fn synced(port: u16) -> Result<(), String> {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let info: redis::RedisResult<String> =
            redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
                .and_then(|mut connection| {
                    redis::cmd("INFO").arg("replication").query(&mut connection)
                });
        if info.is_ok_and(|info| info.contains("master_link_status:up")) {
            return Ok(());
        }
        if Instant::now() > give_up {
            return Err(format!("the replica on port {port} did not sync"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Calls per second of `callers` callers for `duration`: first executions
/// on fresh keys, or replays of one key each.
async fn round(
    idem: &Idempotent,
    callers: usize,
    duration: Duration,
    replay: bool,
    tag: &str,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (idem, stop, done, tag) =
                (idem.clone(), stop.clone(), done.clone(), tag.to_owned());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = if replay {
                        format!("{tag}-{caller}")
                    } else {
                        n += 1;
                        format!("{tag}-{caller}-{n}")
                    };
                    let out: Result<u64, idem_core::Error> =
                        idem.execute(&key, "request", || async { Ok(1) }).await;
                    if out.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

async fn run(args: &Args) -> Result<Vec<(usize, &'static str, f64, f64)>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (master_port, replica_port) = (free_port(), free_port());
    let _master = server(dir.path(), master_port, None)?;
    let _replica = server(dir.path(), replica_port, Some(master_port))?;
    synced(replica_port)?;
    let url = format!("redis://127.0.0.1:{master_port}");
    let plain = RedisStore::connect(url.as_str())
        .await
        .map_err(|e| e.to_string())?;
    let acked = plain
        .clone()
        .with_replica_acks(1, Duration::from_millis(400));
    let (plain, acked) = (Idempotent::new(plain), Idempotent::new(acked));
    let duration = Duration::from_millis(args.duration_ms);
    let mut rows = Vec::new();
    for &callers in &args.callers {
        for (what, replay) in [("first execution", false), ("replay", true)] {
            let (mut without, mut with) = (Vec::new(), Vec::new());
            for rep in 0..args.reps.max(1) {
                let tag = format!("c{callers}-{replay}-{rep}");
                without.push(round(&plain, callers, duration, replay, &format!("p{tag}")).await);
                with.push(round(&acked, callers, duration, replay, &format!("a{tag}")).await);
            }
            let (without, with) = (
                median(&without).unwrap_or(0.0),
                median(&with).unwrap_or(0.0),
            );
            rows.push((callers, what, without, with));
        }
    }
    Ok(rows)
}

/// Runs the binary: reads its command line, measures, prints.
pub fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.quick {
        (args.reps, args.duration_ms, args.callers) = (1, 200, vec![1, 8]);
    }
    let runtime = match cli::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("replica-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(rows) => {
            println!("| callers | calls | without acks /s | with 1 replica ack /s | ratio |");
            println!("|---:|---|---:|---:|---:|");
            for (callers, what, without, with) in rows {
                println!(
                    "| {callers} | {what} | {without:.0} | {with:.0} | {:.2} |",
                    with / without.max(f64::MIN_POSITIVE)
                );
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("replica-bench: {error}");
            ExitCode::FAILURE
        }
    }
}
