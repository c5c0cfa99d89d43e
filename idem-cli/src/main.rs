//! `idem`: look inside an idem store, release a stuck key, reset a settled
//! one, purge expired records and count records by state, for any store by URL.
//!
//! ```text
//! idem --store sqlite:idem.db stats
//! idem --store redis://127.0.0.1/ inspect order-7f3a --scope tenant-1 --namespace payments
//! idem --store postgres://localhost/app list --in-flight --limit 50
//! idem --store mysql://root@localhost/app release order-7f3a --token 9c0d…
//! idem --store sqlite:idem.db reset order-7f3a --reason "refund reissued"
//! idem --store postgres://localhost/app purge
//! ```
//!
//! The store URL may also come from a file (`--store-file PATH`, its first
//! line) or the environment (`IDEM_STORE`), which keeps a password out of
//! the process list. Only `release`, `reset`
//! and `purge` write, each exactly what it says, and every command prints
//! what it did. `release` is fenced: it deletes an in-flight record only if
//! it still holds the token given, the one `inspect` or `list` showed, so a
//! key that a live owner renewed or another caller took over meanwhile is
//! left alone. `reset` deletes only a settled record and refuses one in
//! flight. Exit status: 0 done, 1 refused or failed, 2 bad usage.
//!
//! # Commands
//!
//! Install with `cargo install idem-cli` (from a checkout,
//! `cargo install --path idem-cli`); the binary is `idem`. The store comes from
//! `--store` or `IDEM_STORE` (`sqlite:PATH`, `redis://…`, `postgres://…`,
//! `mysql://…`), with `--table` (SQL) or `--prefix` (Redis) when the
//! application does not use the default:
//!
//! ```text
//! idem --store postgres://localhost/app stats                 # counts by state, expired included
//! idem --store postgres://localhost/app list --in-flight      # held keys, 50 a page; --after to go on
//! idem --store postgres://localhost/app list --failed
//! idem --store postgres://localhost/app inspect order-7f3a --scope tenant-1 --namespace payments
//! idem --store postgres://localhost/app release order-7f3a --scope tenant-1 --namespace payments --token 9c0d…
//! idem --store postgres://localhost/app reset order-7f3a --scope tenant-1 --namespace payments --reason "ticket 311"
//! idem --store postgres://localhost/app purge --dry-run       # then without --dry-run
//! ```
//!
//! `idem doctor URL` (or with `--store`, `--store-file`, `IDEM_STORE`)
//! connects as the library would and says what is wrong, a line a check:
//! the name, the port, TLS, the login, the server, the table or Redis's
//! memory policy and ACL, the clock. Exit 1 when it finds a problem.
//!
//! `inspect` shows the state, the lease and retention left, the token, the
//! fingerprint, and the outcome's size with a preview (control characters
//! escaped). `release` is for a key whose worker is known to be dead; a
//! released key runs its work again on the next request.
//!
//! `reset` deletes a completed or failed record (a remembered failure
//! whose cause is fixed, an outcome a bug recorded) so the key runs again
//! on its next request, whatever the body; it is one atomic step of the
//! store and refuses a key in flight (exit 1, the record untouched: that is
//! `release --token`'s job, for a worker known to be dead). It writes one
//! audit line to standard error (target `idem::audit`: store, namespace,
//! the key's hash, outcome, `--by`, default `$USER`, and `--reason`) and
//! counts `idem_resets_total`, as `Idempotent::reset` does in an
//! application. A near cache of settled records in a running application
//! does not hear of the reset and may replay the old outcome until its
//! entry's cap lapses (60 s by default).
#![forbid(unsafe_code)]

mod commands;
#[cfg(feature = "console")]
mod console;
mod doctor;
mod open;
mod show;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::open::{open, Target};

/// Look inside an idem store.
#[derive(Debug, Parser)]
#[command(name = "idem", version)]
struct Cli {
    /// The store: `sqlite:PATH`, `redis://HOST[:PORT][/DB]`, `postgres://…`,
    /// `mysql://…`; else `--store-file`, else the environment's `IDEM_STORE`.
    #[arg(long, global = true)]
    store: Option<String>,
    /// A file whose first line is the store URL: a password in it stays out
    /// of the process list.
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "store")]
    store_file: Option<std::path::PathBuf>,
    /// The SQL table (PostgreSQL, MySQL); default `idem_records`.
    #[arg(long, global = true)]
    table: Option<String>,
    /// The Redis key prefix; default `idem:`.
    #[arg(long, global = true)]
    prefix: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show one key's record: state, times left, token, fingerprint and a
    /// preview of its outcome. Reads only.
    Inspect(KeyArgs),
    /// List in-flight or failed records, a page at a time. Reads only.
    List(ListArgs),
    /// Delete an in-flight record, only if it still holds TOKEN.
    Release {
        #[command(flatten)]
        key: KeyArgs,
        /// The token `inspect` or `list` showed for the record.
        #[arg(long)]
        token: String,
    },
    /// Delete a completed or failed record so the key runs again; refuses a
    /// key in flight.
    Reset {
        #[command(flatten)]
        key: KeyArgs,
        /// Why, for the audit line.
        #[arg(long, default_value = "")]
        reason: String,
        /// Who asks, for the audit line; default `$USER`.
        #[arg(long)]
        by: Option<String>,
    },
    /// Delete records past their retention (never a live one).
    Purge {
        /// Only count the expired records; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Count records by state. Reads only.
    Stats,
    /// Connect as the library would and say what is wrong: the name, the
    /// port, TLS, the login, the server, the table, Redis's memory policy
    /// and ACL, the clock.
    Doctor(doctor::DoctorArgs),
    /// Serve a web page over the store: keys by state, a record's page,
    /// and release and reset behind a confirmation.
    #[cfg(feature = "console")]
    Console(console::ConsoleArgs),
}

#[derive(Debug, Args)]
struct KeyArgs {
    /// The client key, as the caller sent it.
    key: String,
    /// The scope (tenant or principal) the key belongs to.
    #[arg(long, default_value = "")]
    scope: String,
    /// The namespace the application uses.
    #[arg(long, default_value = "")]
    namespace: String,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false, id = "which")]
struct Which {
    /// Records held by a lease, or whose lease lapsed.
    #[arg(long)]
    in_flight: bool,
    /// Remembered failures.
    #[arg(long)]
    failed: bool,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    which: Which,
    /// How many records a page holds (1 to 1000).
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Where the page starts: the `--after` value the page before printed.
    #[arg(long)]
    after: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The audit lines of `reset` (and only they) go to standard error.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new("off,idem::audit=info"))
        .with_target(true)
        .init();
    let command = match cli.command {
        Command::Doctor(args) => {
            let given = idem_stores::given_url(cli.store.as_deref(), cli.store_file.as_deref())
                .map_err(|e| e.to_string());
            let place = doctor::Place {
                table: cli.table,
                prefix: cli.prefix,
            };
            return doctor::main(given, place, args);
        }
        command => command,
    };
    let url = match idem_stores::given_url(cli.store.as_deref(), cli.store_file.as_deref()) {
        Ok(Some(url)) => url,
        Ok(None) => {
            eprintln!(
                "idem: no store given: pass --store URL or --store-file PATH, or set IDEM_STORE"
            );
            return ExitCode::from(2);
        }
        Err(error) => {
            eprintln!("idem: {error}");
            return ExitCode::from(2);
        }
    };
    let url = url.as_str();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let target = Target {
        url,
        table: cli.table.as_deref(),
        prefix: cli.prefix.as_deref(),
    };
    match runtime.block_on(run(&target, command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("idem: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(target: &Target<'_>, command: Command) -> Result<(), String> {
    let store = open(target).await?;
    match command {
        Command::Inspect(args) => commands::inspect(&store, &args).await,
        Command::List(args) => commands::list(&store, &args).await,
        Command::Release { key, token } => commands::release(&store, &key, &token).await,
        Command::Reset { key, reason, by } => commands::reset(&store, &key, &reason, by).await,
        Command::Purge { dry_run } => commands::purge(&store, dry_run).await,
        Command::Stats => commands::stats(&store).await,
        Command::Doctor(_) => Err("idem doctor runs before a store is opened".to_owned()),
        #[cfg(feature = "console")]
        Command::Console(args) => console::run(store, open::redact(target.url), args).await,
    }
}
