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
//!
//! The queue may also come from a file (`--queue-file PATH`, its first
//! line) or the environment (`IDEM_INBOX_QUEUE`), which keeps a password
//! out of the process list; a flag wins over the file, the file over the
//! environment. A `postgres://` URL takes `sslmode`, `sslrootcert`,
//! `sslcert` and `sslkey` as libpq does. Errors show a URL's password as
//! `***`.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use idem_inbox::queue::{JobId, JobInfo, PostgresQueue, Queue, QueueError, SqliteQueue};

/// Dead letters of an idem inbox queue.
#[derive(Debug, Parser)]
#[command(name = "idem-inbox", version)]
struct Cli {
    /// The queue: a SQLite file path, or a postgres:// URL (default: the
    /// first line of --queue-file, else $IDEM_INBOX_QUEUE).
    #[arg(long)]
    queue: Option<String>,
    /// A file whose first line is the queue, as --queue takes it.
    #[arg(long, value_name = "PATH")]
    queue_file: Option<PathBuf>,
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
    let location = match given_queue(&cli) {
        Ok(location) => location,
        Err(e) => {
            eprintln!("idem-inbox: {e}");
            return ExitCode::from(2);
        }
    };
    let queue = match open(&location, cli.table.as_deref()).await {
        Ok(queue) => queue,
        Err(e) => {
            eprintln!(
                "idem-inbox: cannot open {}: {}",
                redact(&location),
                Redacted(&e, &location)
            );
            return ExitCode::from(2);
        }
    };
    match run(&cli, queue).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idem-inbox: {}", Redacted(&e, &location));
            ExitCode::from(2)
        }
    }
}

/// The environment variable that names the queue when no flag does.
const QUEUE_ENV: &str = "IDEM_INBOX_QUEUE";

/// The queue from `--queue`, else the first line of `--queue-file`, else
/// [`QUEUE_ENV`]. An error names the file, never what it holds.
fn given_queue(cli: &Cli) -> Result<String, String> {
    if let Some(queue) = &cli.queue {
        return Ok(queue.trim().to_owned());
    }
    if let Some(file) = &cli.queue_file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read the queue from {}: {e}", file.display()))?;
        return text
            .lines()
            .map(str::trim)
            .find(|line| !line.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                format!(
                    "cannot read the queue from {}: the file is empty",
                    file.display()
                )
            });
    }
    std::env::var(QUEUE_ENV)
        .ok()
        .map(|queue| queue.trim().to_owned())
        .filter(|queue| !queue.is_empty())
        .ok_or_else(|| format!("no queue: give --queue, --queue-file or {QUEUE_ENV}"))
}

async fn open(location: &str, table: Option<&str>) -> Result<Arc<dyn Queue>, QueueError> {
    if location.starts_with("postgres://") || location.starts_with("postgresql://") {
        let mut queue = PostgresQueue::connect(location).await?;
        if let Some(table) = table {
            queue = queue.with_table(table)?;
        }
        Ok(Arc::new(queue))
    } else {
        Ok(Arc::new(SqliteQueue::open(location).await?))
    }
}

/// `scheme://user:secret@host…` → `scheme://user:***@host…`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

/// An error with its sources, and with the URL's password, should any
/// layer have quoted it, as `***`.
struct Redacted<'a>(&'a QueueError, &'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.0.to_string();
        let mut source = std::error::Error::source(self.0);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        let password = self
            .1
            .split_once("://")
            .and_then(|(_, rest)| rest.split(['/', '?', '#']).next())
            .and_then(|authority| authority.rsplit_once('@'))
            .and_then(|(userinfo, _)| userinfo.split_once(':'))
            .map(|(_, password)| password)
            .filter(|password| !password.is_empty());
        if let Some(password) = password {
            text = text
                .replace(self.1, &redact(self.1))
                .replace(password, "***");
        }
        f.write_str(&text)
    }
}

async fn run(cli: &Cli, queue: Arc<dyn Queue>) -> Result<ExitCode, QueueError> {
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
