//! `wake-bench`: how soon a waiter returns after the owner completes,
//! woken by the store's notifications and by polling only.
//!
//! `cargo run --release -p idem-bench --bin wake-bench -- --help`

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::{self, Servers};
use crate::{fixture, markdown, wake};
use clap::Parser;

/// Measures wake-ups on each store listed: each trial claims a fresh key,
/// starts a waiter, lets it settle into its wait for a varying 0–49 ms and
/// completes the key; the latency runs from the owner's `complete` call to
/// the waiter's return. Stores that send wake-ups get a notified row and a
/// polling-only row, trial by trial in alternation.
///
/// A store whose server cannot be reached is skipped with the reason (an
/// error instead when the CI variable is set).
#[derive(Debug, Parser)]
#[command(name = "wake-bench", version)]
struct Args {
    /// A short run for CI: 20 trials per row.
    #[arg(long)]
    quick: bool,

    /// Trials per row. Default 200, or 20 with --quick.
    #[arg(long)]
    trials: Option<usize>,

    /// Stores to measure, comma-separated, by their `idem-stores` names.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,sqlite,redis,postgres,mysql"
    )]
    stores: Vec<String>,

    #[command(flatten)]
    servers: Servers,

    /// Rewrite the wake-up table in this Markdown file between its
    /// markers: `--markdown BENCHMARKS.md`.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

/// Runs the binary: reads its command line, measures, prints.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let stores = match cli::store_kinds(&args.stores) {
        Ok(stores) => stores,
        Err(message) => {
            eprintln!("wake-bench: {message}");
            return ExitCode::from(2);
        }
    };
    let trials = args
        .trials
        .unwrap_or(if args.quick { 20 } else { 200 })
        .max(1);
    let runtime = match cli::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("wake-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let tag = format!("iw{}", fixture::run_tag());
    let measured = wake::run(&stores, args.servers.places(), &tag, trials);
    let (rows, skipped) = match runtime.block_on(measured) {
        Ok(measured) => measured,
        Err(error) => {
            eprintln!("wake-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    wake::print(&rows, trials);
    if let Some(path) = &args.markdown {
        if let Err(error) = markdown::rewrite(path, &[("wake", wake::markdown(&rows))]) {
            eprintln!("wake-bench: {error}");
            return ExitCode::FAILURE;
        }
    }
    if cli::skips_fail(&skipped) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
