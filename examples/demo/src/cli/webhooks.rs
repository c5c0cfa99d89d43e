//! `idem-demo webhooks` and its worker child, `idem-demo webhooks-worker`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use idem_demo::{run_webhooks, run_webhooks_worker, InboxSpec, WebhooksConfig};

/// The arguments of `idem-demo webhooks`.
#[derive(Debug, Args)]
pub(crate) struct WebhooksArgs {
    /// Where the queue, records and effects live: sqlite:DIR or
    /// postgres://HOST/DB [default: a temporary SQLite directory].
    #[arg(long)]
    store: Option<InboxSpec>,
    /// Distinct events the provider sends.
    #[arg(long, default_value_t = 500)]
    events: usize,
    /// Deliveries in flight at once.
    #[arg(long, default_value_t = 32)]
    senders: usize,
    /// Jobs the worker handles at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Run the worker as a child process and kill it with SIGKILL this many
    /// times, starting it again each time.
    #[arg(long, default_value_t = 0)]
    chaos: usize,
    /// Seed of the provider's plan [default: random].
    #[arg(long)]
    seed: Option<u64>,
    /// The most times the provider delivers one event.
    #[arg(long, default_value_t = 3)]
    max_deliveries: usize,
    /// Milliseconds between two kills under --chaos, on average.
    #[arg(long, default_value_t = 250)]
    kill_every_ms: u64,
    /// No poison events (every event must take effect).
    #[arg(long)]
    no_poison: bool,
    /// Seconds to wait for every event to settle.
    #[arg(long, default_value_t = 120)]
    give_up_after_secs: u64,
}

/// The arguments of the worker child.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The inbox the parent runs.
    #[arg(long)]
    inbox: InboxSpec,
    /// Jobs handled at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
}

pub(crate) async fn webhooks(args: WebhooksArgs) -> ExitCode {
    let mut config = WebhooksConfig::default();
    config.events = args.events;
    config.senders = args.senders.max(1);
    config.concurrency = args.concurrency.max(1);
    config.chaos = args.chaos;
    config.seed = args.seed.unwrap_or(config.seed);
    config.give_up_after = Duration::from_secs(args.give_up_after_secs);
    config.max_deliveries = args.max_deliveries.max(1);
    config.kill_every = Duration::from_millis(args.kill_every_ms.max(2));
    config.poison = !args.no_poison;
    // The temporary directory lives until the run is over.
    let (inbox, _dir) = match args.store {
        Some(inbox) => (inbox, None),
        None => match tempfile::tempdir() {
            Ok(dir) => (InboxSpec::Sqlite(dir.path().to_owned()), Some(dir)),
            Err(e) => {
                eprintln!("webhooks: cannot make a temporary directory: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("webhooks: cannot find this program to run as the worker: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "webhooks: {} events by {} senders, chaos {}, seed {}",
        config.events, config.senders, config.chaos, config.seed
    );
    match run_webhooks(exe, &inbox, &config).await {
        Ok(report) => {
            println!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("webhooks: {e}");
            ExitCode::from(2)
        }
    }
}

pub(crate) async fn worker(args: WorkerArgs) -> ExitCode {
    match run_webhooks_worker(
        &args.inbox,
        args.concurrency.max(1),
        crate::shutdown_signal(),
    )
    .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("webhooks-worker: {e}");
            ExitCode::FAILURE
        }
    }
}
