//! `replica-bench`: what waiting for a replica costs: Redis with
//! `RedisStore::with_replica_acks`, PostgreSQL with a synchronous standby.
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

/// Starts its own primary and one replica on free loopback ports and
/// measures first executions and replays per second through one store
/// that waits for the replica and one that does not, in alternating rounds
/// on the same servers; medians.
///
/// Redis (`redis-server`, no persistence): `with_replica_acks(1, 400 ms)`
/// (below the 500 ms reply timeout of `connect`'s connection) against no
/// acks. PostgreSQL (`initdb`, `pg_basebackup`; `fsync` off on both, so
/// the figure is the replica's round trip, not a disk's): the standby in
/// `synchronous_standby_names` with `synchronous_commit = on` against the
/// same primary with `synchronous_commit = local` on the store's
/// connections.
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

    /// The stores, comma-separated: redis, postgres.
    #[arg(long, value_delimiter = ',', default_value = "redis,postgres")]
    stores: Vec<String>,
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

/// The rows of `plain` against `waiting`: callers, calls, per second
/// without and with the wait.
async fn measure(
    args: &Args,
    plain: &Idempotent,
    waiting: &Idempotent,
) -> Vec<(usize, &'static str, f64, f64)> {
    let duration = Duration::from_millis(args.duration_ms);
    let mut rows = Vec::new();
    for &callers in &args.callers {
        for (what, replay) in [("first execution", false), ("replay", true)] {
            let (mut without, mut with) = (Vec::new(), Vec::new());
            for rep in 0..args.reps.max(1) {
                let tag = format!("c{callers}-{replay}-{rep}");
                without.push(round(plain, callers, duration, replay, &format!("p{tag}")).await);
                with.push(round(waiting, callers, duration, replay, &format!("a{tag}")).await);
            }
            let (without, with) = (
                median(&without).unwrap_or(0.0),
                median(&with).unwrap_or(0.0),
            );
            rows.push((callers, what, without, with));
        }
    }
    rows
}

/// PostgreSQL: a primary with a synchronous standby.
async fn run_postgres(args: &Args) -> Result<Vec<(usize, &'static str, f64, f64)>, String> {
    use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use idem_postgres::PostgresStore;
    use idem_testing::postgres::PgCluster;
    use std::str::FromStr;

    let cluster = PgCluster::new()?;
    let (primary_port, standby_port) = (free_port(), free_port());
    cluster.init_primary(
        "primary",
        "synchronous_commit = on\nsynchronous_standby_names = 'standby'",
    );
    let _primary = cluster.start("primary", primary_port);
    cluster_ready(primary_port).await?;
    cluster.init_standby("standby", primary_port, primary_port, "standby", "");
    let _standby = cluster.start("standby", standby_port);
    let url = PgCluster::url(primary_port);
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let pool = idem_postgres::sqlx::PgPool::connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let sync: i64 = idem_postgres::sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
        )
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())?;
        if sync == 1 {
            break;
        }
        if Instant::now() > give_up {
            return Err("the standby never became synchronous".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = |options: PgConnectOptions| async move {
        // Two pools of 16 stay under the server's 60 connections.
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(|e| e.to_string())?;
        let store = PostgresStore::from_pool(pool);
        store.migrate().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(Idempotent::new(store))
    };
    let options = PgConnectOptions::from_str(&url).map_err(|e| e.to_string())?;
    let waiting = store(options.clone()).await?;
    let plain = store(options.options([("synchronous_commit", "local")])).await?;
    Ok(measure(args, &plain, &waiting).await)
}

/// Waits until the server on `port` takes connections.
async fn cluster_ready(port: u16) -> Result<(), String> {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        match idem_postgres::sqlx::PgPool::connect(&idem_testing::postgres::PgCluster::url(port))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > give_up => return Err(e.to_string()),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Redis: a master and one replica.
async fn run_redis(args: &Args) -> Result<Vec<(usize, &'static str, f64, f64)>, String> {
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
    Ok(measure(args, &plain, &acked).await)
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
    for store in &args.stores {
        let rows = match store.as_str() {
            "redis" => runtime.block_on(run_redis(&args)),
            "postgres" => runtime.block_on(run_postgres(&args)),
            other => Err(format!("no store {other:?}: redis or postgres")),
        };
        match rows {
            Ok(rows) => {
                let (without, with) = match store.as_str() {
                    "redis" => ("without acks /s", "with 1 replica ack /s"),
                    _ => ("synchronous_commit local /s", "synchronous standby /s"),
                };
                println!("{store}:\n");
                println!("| callers | calls | {without} | {with} | ratio |");
                println!("|---:|---|---:|---:|---:|");
                for (callers, what, without, with) in rows {
                    println!(
                        "| {callers} | {what} | {without:.0} | {with:.0} | {:.2} |",
                        with / without.max(f64::MIN_POSITIVE)
                    );
                }
                println!();
            }
            Err(error) => {
                eprintln!("replica-bench: {store}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
