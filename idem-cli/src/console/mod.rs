//! `idem console`: a small web application over one store, where an
//! operator sees which keys are stuck and mends them.
//!
//! Pages are rendered on the server with maud; there is no JavaScript.
//! Every mend is one store primitive the command already uses: `release`
//! is the fenced `Store::remove`, `reset` is `Idempotent::reset_because`,
//! and an inbox's `requeue` is the queue's own, as `idem-inbox` uses it.

mod auth;
mod inbox;
mod pages;
mod rates;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Form, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use idem_core::inspect::Inspect;

/// The options of `idem console`.
#[derive(Debug, clap::Args)]
pub(crate) struct ConsoleArgs {
    /// Where to listen. Any address but loopback requires a token.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// A token every request must carry (header `Authorization: Bearer T`,
    /// or the cookie the page `/login` sets). At least 16 characters.
    #[arg(long, conflicts_with = "token_file")]
    token: Option<String>,
    /// A file holding the token (its first line), kept out of `ps`.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Show outcomes' bodies and header values. They are customers' data,
    /// so they are hidden by default.
    #[arg(long)]
    show_payloads: bool,
    /// A webhook inbox's queue to show: a SQLite file or a postgres:// URL.
    #[arg(long)]
    inbox: Option<String>,
    /// The inbox's PostgreSQL table (default idem_inbox_jobs).
    #[arg(long, requires = "inbox")]
    inbox_table: Option<String>,
    /// An application's Prometheus endpoint (plain HTTP), scraped to chart
    /// its rates per minute over the last hour.
    #[arg(long)]
    metrics: Option<String>,
    /// Seconds between two scrapes of --metrics.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=60))]
    scrape_every: u64,
}

/// What every request handler shares.
pub(crate) struct Console {
    store: Arc<dyn Inspect>,
    /// The store's URL without its password.
    store_name: String,
    /// The token requests must carry, when one was given.
    token: Option<String>,
    /// The token every state-changing form carries; random per process.
    csrf: String,
    show_payloads: bool,
    /// The inbox queue, when one was given.
    inbox: Option<inbox::Inbox>,
    /// The scraped rates, when an endpoint was given.
    rates: Option<Arc<rates::Rates>>,
}

/// Serves the console until the process is stopped.
pub(crate) async fn run(
    store: Arc<dyn Inspect>,
    store_name: String,
    args: ConsoleArgs,
) -> Result<(), String> {
    let token = match (&args.token, &args.token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
            Some(text.lines().next().unwrap_or("").trim().to_owned())
        }
        (None, None) => None,
    };
    if let Some(token) = &token {
        auth::check_token(token)?;
    }
    if token.is_none() && !args.listen.ip().is_loopback() {
        return Err(format!(
            "refusing to listen on {} without a token: give --token or --token-file, \
             or listen on loopback (127.0.0.1)",
            args.listen
        ));
    }
    let inbox = match &args.inbox {
        Some(url) => Some(inbox::open(url, args.inbox_table.as_deref()).await?),
        None => None,
    };
    let rates = match &args.metrics {
        Some(url) => Some(rates::Rates::start(
            url.clone(),
            std::time::Duration::from_secs(args.scrape_every),
        )?),
        None => None,
    };
    let console = Arc::new(Console {
        store,
        store_name,
        token,
        csrf: auth::random_hex(),
        show_payloads: args.show_payloads,
        inbox,
        rates,
    });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("cannot read the address listened on: {e}"))?;
    println!(
        "idem console: listening on http://{bound}/ (store {})",
        console.store_name
    );
    axum::serve(listener, router(console))
        .await
        .map_err(|e| format!("the console stopped: {e}"))
}

fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/keys") }))
        .route("/keys", get(keys))
        .route("/key", get(key))
        .route("/confirm/{action}", get(confirm))
        .route("/release", post(release))
        .route("/reset", post(reset))
        .route("/inbox", get(inbox_list))
        .route("/inbox/job", get(inbox_job))
        .route("/inbox/confirm", get(inbox_confirm))
        .route("/inbox/requeue", post(inbox_requeue))
        .route("/rates", get(rates_page))
        .route("/login", get(auth::login_form).post(auth::login))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&console),
            auth::guard,
        ))
        .with_state(console)
}

type Params = HashMap<String, String>;

/// A parameter, `""` when absent.
fn param<'a>(params: &'a Params, name: &str) -> &'a str {
    params.get(name).map(String::as_str).unwrap_or("")
}

async fn keys(State(console): State<Arc<Console>>, Query(params): Query<Params>) -> Response {
    pages::keys(&console, &params).await.into_response()
}

async fn key(State(console): State<Arc<Console>>, Query(params): Query<Params>) -> Response {
    pages::record(&console, &params).await
}

async fn confirm(
    State(console): State<Arc<Console>>,
    axum::extract::Path(action): axum::extract::Path<String>,
    Query(params): Query<Params>,
) -> Response {
    pages::confirm(&console, &action, &params)
}

async fn release(State(console): State<Arc<Console>>, Form(form): Form<Params>) -> Response {
    if let Some(refused) = auth::check_csrf(&console, &form) {
        return refused;
    }
    pages::release(&console, &form).await
}

async fn reset(State(console): State<Arc<Console>>, Form(form): Form<Params>) -> Response {
    if let Some(refused) = auth::check_csrf(&console, &form) {
        return refused;
    }
    pages::reset(&console, &form).await
}

async fn inbox_list(State(console): State<Arc<Console>>, Query(params): Query<Params>) -> Response {
    inbox::list(&console, &params).await
}

async fn inbox_job(State(console): State<Arc<Console>>, Query(params): Query<Params>) -> Response {
    inbox::job(&console, &params).await
}

async fn inbox_confirm(
    State(console): State<Arc<Console>>,
    Query(params): Query<Params>,
) -> Response {
    inbox::confirm(&console, &params)
}

async fn inbox_requeue(State(console): State<Arc<Console>>, Form(form): Form<Params>) -> Response {
    if let Some(refused) = auth::check_csrf(&console, &form) {
        return refused;
    }
    inbox::requeue(&console, &form).await
}

async fn rates_page(State(console): State<Arc<Console>>) -> Response {
    rates::show(&console)
}
