//! `idem-demo serve` runs the payments API; `idem-demo storm` fires a retry
//! storm at it and checks that every payment was charged exactly once.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idem_demo::{
    run_storm, storm_in_process, RunningServer, StoreSpec, StormConfig, DEFAULT_GATEWAY_LATENCY,
};

mod cli {
    pub(crate) mod chaos;
    pub(crate) mod webhooks;
}
use tracing_subscriber::EnvFilter;

#[derive(Debug, Parser)]
#[command(
    name = "idem-demo",
    version,
    about = "idem's payments API and retry storm"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the payments API until Ctrl-C.
    Serve(ServeArgs),
    /// Fire a retry storm at a payments API and check its ledger.
    Storm(StormArgs),
    /// Run the webhook inbox end to end and check every event took effect once.
    Webhooks(cli::webhooks::WebhooksArgs),
    /// The worker `webhooks --chaos` runs as a child process.
    #[command(hide = true)]
    WebhooksWorker(cli::webhooks::WorkerArgs),
}

/// The store `serve` uses when given none.
const DEFAULT_STORE: &str = "sqlite:idem-demo.db";

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// Idempotency store: sqlite:PATH, redis://HOST, postgres://HOST/DB,
    /// mysql://HOST/DB or memory; else `--store-file`, else the
    /// environment's `IDEM_STORE`, else sqlite:idem-demo.db.
    #[arg(long)]
    store: Option<String>,
    /// A file whose first line is the store's URL: a password in it stays
    /// out of the process list.
    #[arg(long, value_name = "PATH", conflicts_with = "store")]
    store_file: Option<std::path::PathBuf>,
    /// The simulated gateway's latency per charge, in milliseconds (plus up
    /// to as much again of jitter).
    #[arg(long, default_value_t = DEFAULT_GATEWAY_LATENCY.as_millis() as u64)]
    latency_ms: u64,
    /// How long a killed server's keys stay blocked, in milliseconds
    /// (SQLite, PostgreSQL and MariaDB, where charges live in the store's database).
    #[arg(long, default_value_t = 60_000)]
    lease_ms: u64,
    /// Answer replays from this process's memory (`idem_core::store::NearCache`):
    /// settled records only, for at most 60 s. For the layer over Redis or
    /// memory; SQL stores write charges in the claim's own transaction.
    #[arg(long)]
    near_cache: bool,
}

#[derive(Debug, Args)]
struct StormArgs {
    /// A running server to storm; without it, the storm starts its own on a
    /// free port.
    #[arg(long, conflicts_with = "store")]
    url: Option<String>,
    /// Store for the in-process server [default: a temporary SQLite file].
    #[arg(long)]
    store: Option<StoreSpec>,
    /// Clients paying at once.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Distinct payments to make.
    #[arg(long, default_value_t = 500)]
    payments: usize,
    /// Seed for the payments' plans [default: random].
    #[arg(long)]
    seed: Option<u64>,
    /// Milliseconds after which a deliberately dropped request hangs up.
    #[arg(long, default_value_t = 2)]
    drop_after_ms: u64,
    /// Seconds a client keeps retrying one payment before giving up on it.
    #[arg(long, default_value_t = 30)]
    give_up_after_secs: u64,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Run the server as a child process and kill it with SIGKILL this many
    /// times during the storm, restarting it each time, then check the
    /// ledger it persisted (SQLite, PostgreSQL or MariaDB stores).
    #[arg(long, conflicts_with = "url")]
    chaos: Option<usize>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Serve(_) => "info",
        // The storm's own server would drown the progress line in logs.
        Command::Storm(_) | Command::Webhooks(_) | Command::WebhooksWorker(_) => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: logs piped to a file or a
        // collector stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Storm(args) => storm(args).await,
        Command::Webhooks(args) => cli::webhooks::webhooks(args).await,
        Command::WebhooksWorker(args) => cli::webhooks::worker(args).await,
    }
}

async fn serve(args: ServeArgs) -> ExitCode {
    let given = idem_stores::given_url(args.store.as_deref(), args.store_file.as_deref());
    let spec: StoreSpec = match given.map(|url| url.unwrap_or_else(|| DEFAULT_STORE.to_owned())) {
        Ok(url) => match url.parse() {
            Ok(spec) => spec,
            Err(e) => {
                tracing::error!(error = %e, "no such store");
                return ExitCode::from(2);
            }
        },
        Err(e) => {
            tracing::error!(error = %e, "no store URL");
            return ExitCode::from(2);
        }
    };
    let store = match spec.open().await {
        Ok(store) => store,
        Err(e) => {
            tracing::error!(store = %spec, error = %e, "cannot open the store");
            return ExitCode::FAILURE;
        }
    };
    let latency = Duration::from_millis(args.latency_ms);
    let started = match cli::chaos::open_book(&spec).await {
        Ok(Some(_)) if args.near_cache => {
            tracing::error!(store = %spec,
                "--near-cache is for redis:// and memory: with a SQL store the charges are \
                 written in the store's own transaction, which no cache stands in front of");
            return ExitCode::FAILURE;
        }
        Ok(None) if args.near_cache => {
            let cached: Arc<dyn idem_core::store::Store> =
                Arc::new(idem_core::store::NearCache::new(store));
            RunningServer::start(args.addr, cached, latency).await
        }
        Ok(Some(book)) => {
            let lease = Duration::from_millis(args.lease_ms);
            RunningServer::start_in_db(args.addr, book, lease, latency).await
        }
        Ok(None) => RunningServer::start(args.addr, store, latency).await,
        Err(code) => return code,
    };
    let server = match started {
        Ok(server) => server,
        Err(e) => {
            tracing::error!(addr = %args.addr, error = %e, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(url = %server.url(), store = %spec, "payments API listening");
    shutdown_signal().await;
    tracing::info!("shutting down; letting requests in flight finish");
    match server.stop().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}

async fn storm(args: StormArgs) -> ExitCode {
    let mut config = StormConfig::default();
    config.clients = args.clients.max(1);
    config.payments = args.payments;
    config.seed = args.seed.unwrap_or(config.seed);
    config.drop_after = Duration::from_millis(args.drop_after_ms);
    config.give_up_after = Duration::from_secs(args.give_up_after_secs);
    config.progress = !args.quiet;
    eprintln!(
        "storm: {} payments by {} clients, seed {}",
        config.payments, config.clients, config.seed
    );
    if let Some(kills) = args.chaos {
        return cli::chaos::storm(args.store, kills, &config).await;
    }
    let result = match &args.url {
        Some(url) => run_storm(url, &config).await,
        None => {
            // The temporary directory lives until the storm is over.
            let (spec, _dir) = match args.store {
                Some(spec) => (spec, None),
                None => match tempfile::tempdir() {
                    Ok(dir) => (StoreSpec::sqlite(dir.path().join("storm.db")), Some(dir)),
                    Err(e) => {
                        eprintln!("storm: cannot make a temporary directory: {e}");
                        return ExitCode::from(2);
                    }
                },
            };
            let store = match spec.open().await {
                Ok(store) => store,
                Err(e) => {
                    eprintln!("storm: cannot open the store {spec}: {e}");
                    return ExitCode::from(2);
                }
            };
            storm_in_process(store, &config).await.map(|mut report| {
                report.target = format!("an in-process server over {spec}");
                report
            })
        }
    };
    match result {
        Ok(report) => {
            println!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("storm: {e}");
            ExitCode::from(2)
        }
    }
}

/// Ctrl-C, or SIGTERM where there is one (a container being stopped).
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C; stopping");
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
