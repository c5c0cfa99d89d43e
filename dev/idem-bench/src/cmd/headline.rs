//! `idem-bench`: every store against the raw minimal protocol on the same
//! server, in one process, side by side; the project's headline figures.
//!
//! `cargo run --release -p idem-bench -- --help` explains the options;
//! `BENCHMARKS.md` at the repository root is written by
//! `idem-bench --markdown BENCHMARKS.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idem_stores::StoreKind;

use crate::bench::{self, Kind, Plan};
use crate::cli::{self, Servers};
use crate::fixture::{self, BoxError};
use crate::report::Report;
use crate::runner::{Limit, Workload};
use crate::stores::{self, Opened};
use crate::{chart, http, markdown};

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

    #[command(flatten)]
    servers: Servers,

    /// Wall time of each timed run (one row, one repetition), such as
    /// `2s` or `500ms`. Default 2s, or 200ms with --quick.
    #[arg(long, value_parser = cli::parse_duration)]
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

    /// Write a PNG chart of ops/s per store and workload here.
    #[arg(long)]
    chart: Option<PathBuf>,

    /// Rewrite the results table (and, with --http, the HTTP table) in this
    /// Markdown file between its markers, leaving the rest of the file as
    /// it is: `--markdown BENCHMARKS.md`.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
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

    fn wants(&self, store: &str) -> bool {
        self.stores.iter().any(|s| s.trim() == store)
    }
}

/// Runs the binary: reads its command line, measures, prints.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let plan = match args.plan() {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!("idem-bench: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match cli::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
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
    let places = args.servers.places();
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
        http::measure(
            &backends,
            args.servers.redis_url.as_str(),
            plan,
            &mut report,
        )
        .await?;
    }
    Ok(report)
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
    if let Some(path) = &args.markdown {
        // A run writes only the tables it measured: `--stores none --http`
        // leaves the results table as it was.
        let http = report.rows.iter().any(|r| r.store.starts_with("http-"));
        let stores = report.rows.iter().any(|r| !r.store.starts_with("http-"));
        let mut sections = Vec::new();
        if stores {
            sections.push(("results", report.markdown_results()));
        }
        if http {
            sections.push(("http", report.markdown_http()));
        }
        if let Err(error) = markdown::rewrite(path, &sections) {
            eprintln!("idem-bench: {error}");
            return ExitCode::FAILURE;
        }
        // The near cache's section also holds rows wrk writes: merged.
        if let Some(near) = report.markdown_near() {
            if let Err(error) = markdown::rewrite_rows(path, "near-cache", &near, 2) {
                eprintln!("idem-bench: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    if cli::skips_fail(&report.skipped) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
