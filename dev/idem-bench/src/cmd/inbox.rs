//! `inbox-bench`: the webhook inbox's acknowledgement latency, and its
//! worker against a raw claim loop on the same database.
//!
//! `cargo run --release -p idem-bench --bin inbox-bench -- --help`

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::{self, Servers};
use crate::{inbox, markdown};
use clap::Parser;

/// Measures the receiver's acknowledgement latency at 32 senders with the
/// workers stopped, on SQLite and PostgreSQL, and the worker's jobs/s
/// against a raw `FOR UPDATE SKIP LOCKED` loop (PostgreSQL) or a raw
/// claim loop (SQLite) doing the same work, with no work and with 2 ms of
/// work per job.
///
/// PostgreSQL's rows are skipped with the reason when it cannot be reached
/// (an error instead when the CI variable is set).
#[derive(Debug, Parser)]
#[command(name = "inbox-bench", version)]
struct Args {
    /// A short run for CI and a first look: 320 deliveries, 200 jobs, one
    /// repetition.
    #[arg(long)]
    quick: bool,

    #[command(flatten)]
    servers: Servers,

    /// Rewrite the inbox tables in this Markdown file between their
    /// markers: `--markdown BENCHMARKS.md`.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

/// Runs the binary: reads its command line, measures, prints.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match cli::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("inbox-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut skipped = Vec::new();
    let plan = inbox::InboxPlan::new(args.quick);
    let measured = inbox::measure(&args.servers.postgres_url, plan, &mut skipped);
    let lines = match runtime.block_on(measured) {
        Ok(lines) => lines,
        Err(error) => {
            eprintln!("inbox-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    for line in &lines {
        println!("{line}");
    }
    if let Some(path) = &args.markdown {
        if let Err(error) = markdown::rewrite(path, &[("inbox", inbox::markdown(&lines))]) {
            eprintln!("inbox-bench: {error}");
            return ExitCode::FAILURE;
        }
    }
    if cli::skips_fail(&skipped) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
