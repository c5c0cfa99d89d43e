//! idem's benchmark harness: every store against the raw minimal protocol
//! on the same server, in one process, side by side.
//!
//! `cargo run --release -p idem-bench -- --help` explains the options;
//! BENCHMARKS.md at the repository root shows a run and reads it.
#![forbid(unsafe_code)]

mod bench;
mod chart;
mod fixture;
mod http;
mod inbox;
mod inbox_jobs;
mod load;
mod protocols;
mod report;
mod runner;
mod scale;
mod serve;
mod stats;
mod stores;
mod wake;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idem_stores::StoreKind;

use crate::bench::{Kind, Plan};
use crate::fixture::BoxError;
use crate::report::Report;
use crate::runner::{Limit, Workload};
use crate::stores::{Opened, Places};

/// Benchmarks idem's stores against the raw minimal protocol on the same
/// server, in one process.
///
/// For each store and workload (first executions on fresh keys, replays of
/// completed keys, 32 callers contending for one key) and each concurrency,
/// it runs: the raw protocol by hand (a one-round-trip claim and a
/// one-round-trip compare-and-set completion, through the same client as the
/// store), for Redis the common blog recipe as a reference, and idem's
/// `execute`. Rows alternate within each repetition; each figure is the
/// median over repetitions. It prints ops/s, p50 and p99 per row, round
/// trips per operation from the server's own counters, and one line
/// `ratio <store> <workload> c<N> <idem/raw>` per cell.
///
/// A store whose server cannot be reached is skipped with the reason
/// (an error instead when the CI variable is set).
#[derive(Debug, Parser)]
#[command(name = "idem-bench", version)]
struct Args {
    /// A short run for CI and a first look: 200 ms per run, 3 repetitions,
    /// 200 replay keys; under a minute for all four stores.
    #[arg(long)]
    quick: bool,

    /// Stores to measure, comma-separated, by their `idem-stores` names:
    /// memory, sqlite, redis, postgres, mysql (or `none`, with --http, for
    /// the HTTP mode alone).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,sqlite,redis,postgres,mysql"
    )]
    stores: Vec<String>,

    /// Workloads, comma-separated: first, replay, contended.
    #[arg(long, value_delimiter = ',', default_value = "first,replay,contended")]
    workloads: Vec<String>,

    /// Concurrent callers, comma-separated; every workload runs at each.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    concurrency: Vec<usize>,

    /// Redis server.
    #[arg(long, env = "IDEM_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,

    /// PostgreSQL server.
    #[arg(
        long,
        env = "IDEM_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    postgres_url: String,

    /// MariaDB server.
    #[arg(
        long,
        env = "IDEM_MYSQL_URL",
        default_value = "mysql://root@127.0.0.1:3306/test"
    )]
    mysql_url: String,

    /// Wall time of each timed run (one row, one repetition), such as
    /// `2s` or `500ms`. Default 2s, or 200ms with --quick.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,

    /// Stop each timed run after this many operations instead.
    #[arg(long, conflicts_with = "duration")]
    ops: Option<u64>,

    /// Repetitions of each cell (rows alternate within each). Default 3.
    #[arg(long)]
    reps: Option<usize>,

    /// Completed keys the replay workload cycles through. Default 1000, or
    /// 200 with --quick.
    #[arg(long)]
    replay_keys: Option<u64>,

    /// Rows to run, comma-separated: raw, blog, raw-1tx, raw-ttl, control, idem (all
    /// by default). Handy for profiling one row alone; ratios need both
    /// idem and its baseline.
    #[arg(long, value_delimiter = ',')]
    rows: Vec<String>,

    /// Also run the HTTP mode, over the backends listed (`memory`,
    /// `redis`; both when none is given): an axum app behind
    /// `IdempotencyLayer` against an axum control that makes one plain store
    /// round trip per request, from 32 keep-alive connections.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_missing_value = "memory,redis")]
    http: Option<Vec<String>>,

    /// Serve the HTTP mode's apps instead of measuring, for an external
    /// load generator: axum and actix-web behind the layer and each
    /// framework's control, over `memory` or `redis`; prints one line
    /// `serving <name> <url>` per server and runs until stopped. See
    /// `dev/idem-bench/wrk/`.
    #[arg(long, value_name = "BACKEND")]
    serve_http: Option<String>,

    /// First port of --serve-http's four servers (free ports when 0).
    #[arg(long, default_value_t = 0)]
    serve_port: u16,

    /// Measure wake-ups instead: how soon a waiter returns after the owner
    /// completes, woken by the store's notifications and polling only, on
    /// each store listed, with this many trials per row (default 200).
    #[arg(long, num_args = 0..=1, default_missing_value = "200")]
    wake: Option<usize>,
    /// Also measure the webhook inbox: the receiver's acknowledgement
    /// latency at 32 senders on SQLite and PostgreSQL, and the worker's
    /// jobs/s against a raw `FOR UPDATE SKIP LOCKED` loop on PostgreSQL
    /// (`--stores none --inbox` for these alone).
    #[arg(long)]
    inbox: bool,

    /// Write a PNG chart of ops/s per store and workload here.
    #[arg(long)]
    chart: Option<PathBuf>,

    /// Folder for the SQLite files (a temporary folder by default).
    #[arg(long)]
    sqlite_dir: Option<PathBuf>,

    /// Open the SQLite stores with memory-mapped I/O of up to this many
    /// bytes (`SqliteStore::with_mmap_size`; off by default, as in the
    /// store).
    #[arg(long, value_name = "BYTES")]
    sqlite_mmap: Option<u64>,

    /// Run the scale mode instead: fill each store listed in bulk to each
    /// of --scale-sizes, measure first executions and replays through
    /// `execute` at each size (--concurrency, --reps, --duration apply),
    /// weigh the records, then churn the largest with a purger running.
    #[arg(long)]
    scale: bool,

    /// Record counts the scale mode fills to, ascending, such as
    /// `10k,1m,10m` (the default; `10k,100k` with --quick). Latency growth
    /// is against the first.
    #[arg(long, value_delimiter = ',', value_parser = scale::parse_size)]
    scale_sizes: Vec<u64>,

    /// First executions per second during the churn. Default 1000, or
    /// 300 with --quick.
    #[arg(long)]
    scale_rate: Option<u64>,

    /// Retention of the churn's records. Default 30s, or 1s with --quick.
    #[arg(long, value_parser = parse_duration)]
    scale_retention: Option<Duration>,

    /// The purger's period during the churn. Default 5s, or 250ms with
    /// --quick.
    #[arg(long, value_parser = parse_duration)]
    scale_purge_every: Option<Duration>,

    /// Records the churn's purger asks `purge_expired` for per call.
    /// Default idem-core's `PURGE_BATCH` (1000), what `spawn_purger` uses.
    #[arg(long)]
    scale_purge_batch: Option<usize>,

    /// Run the churn with its purger off: the control that shows what the
    /// steady window does without purging (expired records pile up).
    #[arg(long)]
    scale_purge_off: bool,

    /// How long the churn's steady state is measured. Default 60s, or 1s
    /// with --quick.
    #[arg(long, value_parser = parse_duration)]
    scale_window: Option<Duration>,
}

impl Args {
    fn plan(&self) -> Result<Plan, String> {
        let workloads = self
            .workloads
            .iter()
            .map(|w| Workload::parse(w.trim()).ok_or_else(|| format!("unknown workload {w:?}")))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(row) = self.rows.iter().find(|r| {
            ![
                Kind::Raw,
                Kind::Blog,
                Kind::Single,
                Kind::Timed,
                Kind::Control,
                Kind::Idem,
                Kind::RawTx,
                Kind::IdemTx,
                Kind::IdemSteps,
                Kind::IdemNear,
            ]
            .iter()
            .any(|k| k.name() == r.trim())
        }) {
            return Err(format!("unknown row {row:?}"));
        }
        if self.concurrency.contains(&0) {
            return Err("a concurrency must be at least 1".to_owned());
        }
        let duration = self.duration.unwrap_or(if self.quick {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(2)
        });
        let limit = self.ops.map_or(Limit::Time(duration), Limit::Ops);
        let warmup = match limit {
            Limit::Time(d) => Limit::Time(d / 4),
            Limit::Ops(n) => Limit::Ops((n / 4).max(1)),
        };
        Ok(Plan {
            workloads,
            concurrency: self.concurrency.clone(),
            reps: self.reps.unwrap_or(3).max(1),
            limit,
            warmup,
            replay_pool: self
                .replay_keys
                .unwrap_or(if self.quick { 200 } else { 1000 })
                .max(1),
            tag: format!("ib{}", fixture::run_tag()),
            rows: self.rows.iter().map(|r| r.trim().to_owned()).collect(),
        })
    }

    fn scale_plan(&self) -> Result<scale::ScalePlan, String> {
        let quick = self.quick;
        let mut sizes = if self.scale_sizes.is_empty() {
            if quick {
                vec![10_000, 100_000]
            } else {
                vec![10_000, 1_000_000, 10_000_000]
            }
        } else {
            self.scale_sizes.clone()
        };
        if sizes.windows(2).any(|w| w[0] >= w[1]) {
            return Err("--scale-sizes must ascend".to_owned());
        }
        sizes.dedup();
        if self.concurrency.contains(&0) {
            return Err("a concurrency must be at least 1".to_owned());
        }
        let pick = |given: Option<Duration>, full: u64, short: u64| {
            given.unwrap_or(Duration::from_millis(if quick { short } else { full }))
        };
        let run = pick(self.duration, 2000, 150);
        Ok(scale::ScalePlan {
            sizes,
            concurrency: self.concurrency.clone(),
            reps: self.reps.unwrap_or(if quick { 2 } else { 3 }).max(1),
            run,
            warmup: run / 4,
            churn: scale::Churn {
                rate: self
                    .scale_rate
                    .unwrap_or(if quick { 300 } else { 1000 })
                    .max(1),
                retention: pick(self.scale_retention, 30_000, 1000),
                every: pick(self.scale_purge_every, 5000, 250),
                batch: self
                    .scale_purge_batch
                    .unwrap_or(idem_core::store::PURGE_BATCH)
                    .max(1),
                purge: !self.scale_purge_off,
                window: pick(self.scale_window, 60_000, 1000),
            },
            first_retention: Duration::from_millis(if quick { 500 } else { 1000 }),
            tag: format!("is{}", fixture::run_tag()),
        })
    }

    fn wants(&self, store: &str) -> bool {
        self.stores.iter().any(|s| s.trim() == store)
    }
}

/// Reads `250ms`, `2s`, `1.5s` or `1m`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((text, "s"), |at| text.split_at(at));
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 2s or 500ms"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit {unit:?}: use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let plan = match args.plan() {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!("idem-bench: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem-bench: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(backend) = &args.serve_http {
        let served = serve::run(backend, &args.redis_url, args.serve_port, &plan.tag);
        return match runtime.block_on(served) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("idem-bench: {error}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(trials) = args.wake {
        let stores: Vec<&str> = args.stores.iter().map(|s| s.trim()).collect();
        let urls = (
            args.redis_url.as_str(),
            args.postgres_url.as_str(),
            args.mysql_url.as_str(),
        );
        return match runtime.block_on(wake::run(&stores, urls, &plan.tag, trials.max(1))) {
            Ok(rows) => {
                wake::print(&rows, trials.max(1));
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("idem-bench: {error}");
                ExitCode::FAILURE
            }
        };
    }
    if args.scale {
        return scale_mode(&args, &runtime);
    }
    match runtime.block_on(run(&args, &plan)) {
        Ok(report) => finish(&args, &report),
        Err(error) => {
            eprintln!("idem-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args, plan: &Plan) -> Result<Report, BoxError> {
    let mut report = Report::default();
    for store in args.stores.iter().map(|s| s.trim()) {
        if !matches!(store, "none" | "") {
            store.parse::<StoreKind>()?;
        }
    }
    eprintln!("idem-bench: {plan:?}");
    let places = Places {
        redis_url: &args.redis_url,
        postgres_url: &args.postgres_url,
        mysql_url: &args.mysql_url,
        sqlite_dir: args.sqlite_dir.as_deref(),
        sqlite_mmap: args.sqlite_mmap,
    };
    for kind in StoreKind::ALL {
        let name = kind.name();
        if !args.wants(name) {
            continue;
        }
        let bench = match stores::open(kind, places, &plan.tag).await? {
            Opened::Bench(bench) => bench,
            Opened::Skipped(url, reason) => {
                skip(&mut report, name, &url, &reason);
                continue;
            }
        };
        eprintln!("idem-bench: measuring {name}");
        let measured = bench::measure(bench.as_ref(), plan, &mut report).await;
        let finished = bench.finish(&mut report).await;
        measured?;
        finished?;
    }
    if let Some(backends) = &args.http {
        let backends: Vec<&str> = backends.iter().map(|b| b.trim()).collect();
        if let Some(other) = backends.iter().find(|b| !matches!(**b, "memory" | "redis")) {
            return Err(format!("unknown HTTP backend {other:?}: use memory or redis").into());
        }
        http::measure(&backends, args.redis_url.as_str(), plan, &mut report).await?;
    }
    if args.inbox {
        eprintln!("idem-bench: measuring the inbox");
        let lines = inbox::measure(
            &args.postgres_url,
            inbox::InboxPlan::new(args.quick),
            &mut report.skipped,
        )
        .await?;
        for line in lines {
            println!("{line}");
        }
    }
    Ok(report)
}

fn scale_mode(args: &Args, runtime: &tokio::runtime::Runtime) -> ExitCode {
    let plan = match args.scale_plan() {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!("idem-bench: {message}");
            return ExitCode::from(2);
        }
    };
    let stores: Vec<&str> = args.stores.iter().map(|s| s.trim()).collect();
    for store in &stores {
        if let Err(error) = store.parse::<StoreKind>() {
            eprintln!("idem-bench: {error}");
            return ExitCode::from(2);
        }
    }
    let places = Places {
        redis_url: &args.redis_url,
        postgres_url: &args.postgres_url,
        mysql_url: &args.mysql_url,
        sqlite_dir: args.sqlite_dir.as_deref(),
        sqlite_mmap: args.sqlite_mmap,
    };
    let report = match runtime.block_on(scale::run(&stores, places, &plan)) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("idem-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", scale::render(&report));
    let errors = report.errors();
    if errors > 0 {
        eprintln!("idem-bench: {errors} operations failed; see the lines marked with errors");
        return ExitCode::FAILURE;
    }
    if std::env::var_os("CI").is_some() && !report.skipped.is_empty() {
        eprintln!("idem-bench: CI is set, so an unreachable store is a failure");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn skip(report: &mut Report, store: &str, url: &str, reason: &BoxError) {
    let line = format!("{store} at {url} is unreachable ({reason}); its rows are skipped");
    eprintln!("idem-bench: {line}");
    report.skipped.push(line);
}

fn finish(args: &Args, report: &Report) -> ExitCode {
    print!("{}", report.render());
    if let Some(path) = &args.chart {
        match chart::draw(report, path) {
            Ok(()) => eprintln!("idem-bench: chart written to {}", path.display()),
            Err(error) => {
                eprintln!("idem-bench: cannot draw the chart: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    let errors: u64 = report.rows.iter().map(|r| r.tally.errors).sum();
    if errors > 0 {
        eprintln!("idem-bench: {errors} operations failed; see the rows marked with errors");
        return ExitCode::FAILURE;
    }
    if std::env::var_os("CI").is_some() && !report.skipped.is_empty() {
        eprintln!("idem-bench: CI is set, so an unreachable store is a failure");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_common_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3h").is_err());
    }
}
