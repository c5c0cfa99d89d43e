//! `idem-inbox`: list, inspect and requeue dead letters.
//!
//! Built with the `cli` feature, off by default so that the library does
//! not bring clap into applications: `cargo install idem-inbox --features
//! cli`, or from a checkout `cargo run -p idem-inbox --features cli -- …`.
//!
//! ```text
//! idem-inbox --queue inbox.db dead-letters
//! idem-inbox --queue postgres://root@127.0.0.1/test --table idem_inbox_jobs inspect 42
//! idem-inbox --queue inbox.db requeue 42
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use idem_inbox::queue::{JobId, JobInfo, PostgresQueue, Queue, QueueError, SqliteQueue};

/// Dead letters of an idem inbox queue.
#[derive(Debug, Parser)]
#[command(name = "idem-inbox", version)]
struct Cli {
    /// The queue: a SQLite file path, or a postgres:// URL.
    #[arg(long, env = "IDEM_INBOX_QUEUE")]
    queue: String,
    /// The PostgreSQL table (default idem_inbox_jobs).
    #[arg(long)]
    table: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lists dead letters, oldest first: id, source, event id, attempts,
    /// last error.
    DeadLetters {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Shows one job, dead or not, with its attempt history, as JSON.
    Inspect {
        /// The job id.
        id: String,
    },
    /// Makes a dead letter due again, its attempts counted afresh.
    Requeue {
        /// The job id.
        id: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idem-inbox: {e}");
            ExitCode::from(2)
        }
    }
}

async fn open(cli: &Cli) -> Result<Arc<dyn Queue>, QueueError> {
    if cli.queue.starts_with("postgres://") || cli.queue.starts_with("postgresql://") {
        let mut queue = PostgresQueue::connect(&cli.queue).await?;
        if let Some(table) = &cli.table {
            queue = queue.with_table(table)?;
        }
        Ok(Arc::new(queue))
    } else {
        Ok(Arc::new(SqliteQueue::open(&cli.queue).await?))
    }
}

async fn run(cli: Cli) -> Result<ExitCode, QueueError> {
    let queue = open(&cli).await?;
    match &cli.command {
        Command::DeadLetters { limit } => {
            for job in queue.dead_letters(*limit).await? {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    job.id,
                    job.source,
                    job.event_id,
                    job.attempts,
                    job.last_error.as_deref().unwrap_or("")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { id } => match queue.inspect(&JobId::new(id.as_str())).await? {
            Some(job) => {
                println!("{}", to_json(&job));
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("idem-inbox: no job {id}");
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Requeue { id } => {
            if queue.requeue(&JobId::new(id.as_str())).await? {
                println!("requeued {id}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("idem-inbox: {id} is not a dead letter");
                Ok(ExitCode::FAILURE)
            }
        }
    }
}

fn to_json(job: &JobInfo) -> String {
    let value = serde_json::json!({
        "id": job.id,
        "source": job.source,
        "event_id": job.event_id,
        "state": job.state,
        "attempts": job.attempts,
        "lapses": job.lapses,
        "last_error": job.last_error,
        "history": job.history,
        "payload": String::from_utf8_lossy(&job.payload),
    });
    serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string())
}
