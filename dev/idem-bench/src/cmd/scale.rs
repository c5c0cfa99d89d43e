//! `scale-bench`: how claim and replay latency, bytes per record and
//! purging behave as a store fills to millions of records.
//!
//! `cargo run --release -p idem-bench --bin scale-bench -- --help`

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{self, Servers};
use crate::{fixture, markdown, scale};
use clap::Parser;

/// Fills each store listed in bulk to each of --sizes, measures first
/// executions and replays through `execute` at each size, weighs the
/// records, then churns the largest with a purger running.
///
/// A store whose server cannot be reached is skipped with the reason (an
/// error instead when the CI variable is set).
#[derive(Debug, Parser)]
#[command(name = "scale-bench", version)]
struct Args {
    /// A short run for CI and a first look: sizes 10k and 100k, 150 ms
    /// runs, 2 repetitions, a one-second churn.
    #[arg(long)]
    quick: bool,

    /// Stores to measure, comma-separated, by their `idem-stores` names.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,sqlite,redis,postgres,mysql"
    )]
    stores: Vec<String>,

    /// Concurrent callers, comma-separated; every workload runs at each.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    concurrency: Vec<usize>,

    #[command(flatten)]
    servers: Servers,

    /// Wall time of each timed run. Default 2s, or 150ms with --quick.
    #[arg(long, value_parser = cli::parse_duration)]
    duration: Option<Duration>,

    /// Repetitions of each cell. Default 3, or 2 with --quick.
    #[arg(long)]
    reps: Option<usize>,

    /// Record counts to fill to, ascending, such as `10k,1m,10m` (the
    /// default; `10k,100k` with --quick). Latency growth is against the
    /// first.
    #[arg(long, value_delimiter = ',', value_parser = scale::parse_size)]
    sizes: Vec<u64>,

    /// First executions per second during the churn. Default 1000, or
    /// 300 with --quick.
    #[arg(long)]
    rate: Option<u64>,

    /// Retention of the churn's records. Default 30s, or 1s with --quick.
    #[arg(long, value_parser = cli::parse_duration)]
    retention: Option<Duration>,

    /// The purger's period during the churn. Default 5s, or 250ms with
    /// --quick.
    #[arg(long, value_parser = cli::parse_duration)]
    purge_every: Option<Duration>,

    /// Records the churn's purger asks `purge_expired` for per call.
    /// Default idem-core's `PURGE_BATCH` (1000), what `spawn_purger` uses.
    #[arg(long)]
    purge_batch: Option<usize>,

    /// Run the churn with its purger off: the control that shows what the
    /// steady window does without purging (expired records pile up).
    #[arg(long)]
    purge_off: bool,

    /// How long the churn's steady state is measured. Default 60s, or 1s
    /// with --quick.
    #[arg(long, value_parser = cli::parse_duration)]
    window: Option<Duration>,

    /// Rewrite the scale table in this Markdown file between its markers:
    /// `--markdown BENCHMARKS.md`.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

impl Args {
    fn plan(&self) -> Result<scale::ScalePlan, String> {
        let quick = self.quick;
        let mut sizes = if self.sizes.is_empty() {
            if quick {
                vec![10_000, 100_000]
            } else {
                vec![10_000, 1_000_000, 10_000_000]
            }
        } else {
            self.sizes.clone()
        };
        if sizes.windows(2).any(|w| w[0] >= w[1]) {
            return Err("--sizes must ascend".to_owned());
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
                rate: self.rate.unwrap_or(if quick { 300 } else { 1000 }).max(1),
                retention: pick(self.retention, 30_000, 1000),
                every: pick(self.purge_every, 5000, 250),
                batch: self
                    .purge_batch
                    .unwrap_or(idem_core::store::PURGE_BATCH)
                    .max(1),
                purge: !self.purge_off,
                window: pick(self.window, 60_000, 1000),
            },
            first_retention: Duration::from_millis(if quick { 500 } else { 1000 }),
            tag: format!("is{}", fixture::run_tag()),
        })
    }
}

/// Runs the binary: reads its command line, measures, prints.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let (plan, stores) = match args
        .plan()
        .and_then(|p| Ok((p, cli::store_kinds(&args.stores)?)))
    {
        Ok(planned) => planned,
        Err(message) => {
            eprintln!("scale-bench: {message}");
            return ExitCode::from(2);
        }
    };
    let runtime = match cli::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("scale-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let places = args.servers.places();
    let report = match runtime.block_on(scale::run(&stores, places, &plan)) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("scale-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", scale::render(&report));
    let errors = report.errors();
    if errors > 0 {
        eprintln!("scale-bench: {errors} operations failed; see the lines marked with errors");
        return ExitCode::FAILURE;
    }
    if let Some(path) = &args.markdown {
        if let Err(error) = markdown::rewrite(path, &[("scale", scale::markdown(&report))]) {
            eprintln!("scale-bench: {error}");
            return ExitCode::FAILURE;
        }
    }
    if cli::skips_fail(&report.skipped) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
