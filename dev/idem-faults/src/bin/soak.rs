//! Soaks the stores with the conformance kit's generated interleavings:
//! `N` schedules per store against the real servers, with progress, and on
//! a failure the seed and the smallest schedule that reproduces it.
//!
//! ```text
//! nice -n 10 cargo run -p idem-faults --bin soak -- --schedules 10000
//! nice -n 10 cargo run -p idem-faults --bin soak -- --stores redis,cluster --schedules 500 --seed 7
//! ```
//!
//! Stores: `memory`, `sqlite` (a temporary file), `redis` (the server at
//! `IDEM_REDIS_URL`, under a fresh key prefix), `cluster` (a 3-master Redis
//! Cluster started from `redis-server` and `redis-cli` on free ports),
//! `postgres` (`IDEM_POSTGRES_URL`, on a fresh table) and `mysql` (MariaDB
//! at `IDEM_MYSQL_URL`, on a fresh table). Whatever a store
//! wrote is removed when its soak ends. The process exits with 1 when a
//! schedule broke an invariant and with 2 when a store cannot be reached.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idem_conformance::{soak, Fixture, Interleavings, Soak};
use idem_core::store::Store;
use idem_core::MemoryStore;
use idem_faults::unique_name;
use idem_redis::redis;
use idem_testing::process::{server_ports, CLUSTER_BUS};
use idem_testing::{StoreKind, TestStore};

/// Soaks stores with generated interleavings.
#[derive(Debug, Parser)]
struct Args {
    /// Schedules per store.
    #[arg(long, default_value_t = 1000)]
    schedules: u32,
    /// Stores to soak, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,sqlite,redis,cluster,postgres,mysql"
    )]
    stores: Vec<String>,
    /// Schedules played at once, each under its own key prefix.
    #[arg(long, default_value_t = 8)]
    at_once: usize,
    /// The callers' lease in milliseconds; every time in a schedule scales
    /// with it. All these stores keep time to a millisecond or better.
    #[arg(long, default_value_t = 50)]
    lease_ms: u64,
    /// The seed; a failure prints the one to pass here to replay it.
    #[arg(long)]
    seed: Option<u64>,
    /// The index of the first schedule of the seed's sequence to play.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 10)]
    every: u64,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    let mut settings = Interleavings::from_env()
        .with_schedules(args.schedules)
        .with_at_once(args.at_once)
        .with_lease(Duration::from_millis(args.lease_ms))
        .with_first(args.from);
    if let Some(seed) = args.seed {
        settings = settings.with_seed(seed);
    }
    println!(
        "soaking {:?}: {} schedules each, {} at once, {} ms lease",
        args.stores, settings.schedules, settings.at_once, args.lease_ms
    );
    let mut results = Vec::new();
    let mut failed = false;
    for name in &args.stores {
        let Some(store) = Target::open(name).await else {
            std::process::exit(2);
        };
        let soaked = soak_one(name, &store.store, &settings, args.every).await;
        store.clean_up().await;
        if let Some(failure) = &soaked.failure {
            println!(
                "{name}: FAILED\n{failure}\nplay it again alone: soak --stores {name} --seed {} --from {} --schedules 1 --lease-ms {}",
                failure.seed, failure.index, args.lease_ms
            );
            failed = true;
        }
        results.push((name.clone(), soaked));
        if failed {
            break;
        }
    }
    println!(
        "\n| store | schedules | callers | crashes | stalls | executions | violations | time |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, s) in &results {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {:.0?} |",
            s.schedules, s.callers, s.crashes, s.stalls, s.executions, s.violations, s.elapsed
        );
    }
    if failed {
        std::process::exit(1);
    }
}

/// Plays the schedules on `store`, printing a line at most every `every`
/// seconds.
async fn soak_one(
    name: &str,
    store: &Arc<dyn Store>,
    settings: &Interleavings,
    every: u64,
) -> Soak {
    // Every schedule of a soak has its own key prefix, so all may share one
    // store: no table or connection is set up per schedule.
    let shared = Arc::clone(store);
    let factory = move || {
        let store = Arc::clone(&shared);
        async move { Fixture::from_arc(store, ()) }
    };
    let mut last = Instant::now();
    let total = settings.schedules;
    let soaked = soak(&factory, settings, |s: &Soak| {
        if last.elapsed() >= Duration::from_secs(every) || s.failure.is_some() {
            last = Instant::now();
            println!(
                "{name}: {}/{total} schedules, {} callers, {} crashes, {} stalls, {} executions, {} violations, {:.1} schedules/s",
                s.schedules,
                s.callers,
                s.crashes,
                s.stalls,
                s.executions,
                s.violations,
                s.schedules as f64 / s.elapsed.as_secs_f64().max(0.001)
            );
        }
    })
    .await;
    println!(
        "{name}: done: {} schedules in {:.1?} (seed {})",
        soaked.schedules, soaked.elapsed, soaked.seed
    );
    soaked
}

/// A store to soak and what to remove afterwards.
struct Target {
    store: Arc<dyn Store>,
    cleanup: Cleanup,
}

enum Cleanup {
    /// Removes the prefix, table or file when dropped.
    Guard(idem_testing::Cleanup),
    Cluster(Vec<Child>, PathBuf),
}

impl Target {
    /// Opens store `name`, or prints why it cannot.
    async fn open(name: &str) -> Option<Target> {
        if name == "cluster" {
            return cluster().await;
        }
        let kind = match name.parse::<StoreKind>() {
            Ok(kind) => kind,
            Err(unknown) => {
                eprintln!("{unknown}, cluster");
                return None;
            }
        };
        // A fresh prefix, table or file, removed when the guard drops.
        let fresh = kind.fresh().await?;
        Some(Target {
            store: fresh.store,
            cleanup: Cleanup::Guard(fresh.guard),
        })
    }

    /// Removes what the soak wrote; a failure is printed, not fatal.
    async fn clean_up(self) {
        drop(self.store);
        match self.cleanup {
            Cleanup::Guard(guard) => drop(guard),
            Cleanup::Cluster(children, dir) => {
                for mut child in children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// Starts a 3-master Redis Cluster on free loopback ports, without
/// persistence, and connects a store to it.
async fn cluster() -> Option<Target> {
    let dir = std::env::temp_dir().join(unique_name("soak_cluster"));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot make {}: {e}", dir.display());
        return None;
    }
    let ports = server_ports(3, CLUSTER_BUS);
    let mut children = Vec::new();
    for port in &ports {
        let started = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
            ])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match started {
            Ok(child) => children.push(child),
            Err(e) => {
                eprintln!("cannot start redis-server: {e}");
                break;
            }
        }
    }
    let cleanup = Cleanup::Cluster(children, dir);
    let urls: Vec<String> = ports
        .iter()
        .map(|port| format!("redis://127.0.0.1:{port}"))
        .collect();
    let ready = async {
        for url in &urls {
            wait_for(url, |_| true).await?;
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !created.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&created.stdout)
            ));
        }
        for url in &urls {
            wait_for(url, |info| info.contains("cluster_state:ok")).await?;
        }
        idem_redis::RedisStore::connect_cluster(urls.clone())
            .await
            .map_err(|e| e.to_string())
    };
    match ready.await {
        Ok(store) => Some(Target {
            store: Arc::new(store.with_prefix(format!("{}:", unique_name("soak")))),
            cleanup,
        }),
        Err(e) => {
            eprintln!("cannot start a Redis Cluster: {e}");
            Target {
                store: Arc::new(MemoryStore::new()),
                cleanup,
            }
            .clean_up()
            .await;
            None
        }
    }
}

/// Polls `CLUSTER INFO` (or just the connection) on `url` until `ready`
/// accepts it, for up to 20 s.
async fn wait_for(url: &str, ready: impl Fn(&str) -> bool) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(20);
    let mut last = String::from("not ready");
    while Instant::now() < until {
        let info = async {
            let client = redis::Client::open(url)?;
            let mut connection = client.get_multiplexed_async_connection().await?;
            redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async::<String>(&mut connection)
                .await
        };
        match info.await {
            Ok(info) if ready(&info) => return Ok(()),
            Ok(_) => {}
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{url}: {last}"))
}
