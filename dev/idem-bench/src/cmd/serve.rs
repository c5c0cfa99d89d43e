//! `serve-bench`: the HTTP mode's apps served for an external load
//! generator (see `dev/idem-bench/wrk/`).
//!
//! `cargo run --release -p idem-bench --bin serve-bench -- memory`

use std::process::ExitCode;

use crate::fixture::{self, BoxError};
use crate::serve;
use clap::Parser;
use idem_testing::Server;

/// Serves axum behind `IdempotencyLayer`, actix-web behind
/// `IdempotencyMiddleware` and each framework's control (one plain store
/// call per request) on 127.0.0.1, over the memory store or Redis; prints
/// one line `serving <name> <url>` per server and runs until stopped.
#[derive(Debug, Parser)]
#[command(name = "serve-bench", version)]
struct Args {
    /// The store behind the servers: memory or redis.
    #[arg(default_value = "memory")]
    backend: String,

    /// First port of the four servers (free ports when 0).
    #[arg(long, default_value_t = 0)]
    port: u16,

    /// Redis server.
    #[arg(long, env = Server::Redis.env_var(), default_value = Server::Redis.default_url())]
    redis_url: String,

    /// Check the servers and exit instead of serving: one request to each,
    /// then the same request again, which the idem servers must replay.
    #[arg(long)]
    quick: bool,
}

/// Runs the binary: reads its command line, measures, prints.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match crate::cli::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("serve-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let tag = fixture::run_tag();
    let served = async {
        let servers = serve::start(&args.backend, &args.redis_url, args.port, &tag).await?;
        for (name, addr) in &servers {
            println!("serving {name} http://{addr}/pay");
        }
        if args.quick {
            check(&servers, &tag).await
        } else {
            std::future::pending::<()>().await;
            Ok(())
        }
    };
    match runtime.block_on(served) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("serve-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Sends each server one order and then the same order again: every
/// answer must be 201 with the outcome body, and the idem servers must
/// mark the second as a replay.
async fn check(
    servers: &[(&'static str, std::net::SocketAddr)],
    tag: &str,
) -> Result<(), BoxError> {
    let client = reqwest::Client::new();
    for (name, addr) in servers {
        for attempt in 0..2 {
            let response = client
                .post(format!("http://{addr}/pay"))
                .header("content-type", "application/json")
                .header("idempotency-key", format!("{tag}-check"))
                .body(serde_json::to_vec(&fixture::Order::sample())?)
                .send()
                .await?;
            let status = response.status();
            let replayed = response
                .headers()
                .contains_key(idem_http::REPLAYED.as_str());
            let body = response.bytes().await?;
            if status != reqwest::StatusCode::CREATED || body != fixture::outcome_body() {
                return Err(format!("{name} answered {status} with {body:?}").into());
            }
            if name.ends_with("-idem") && replayed != (attempt == 1) {
                return Err(format!("{name}: request {attempt} replayed: {replayed}").into());
            }
            println!("checked {name} request {attempt}: {status}, replayed {replayed}");
        }
    }
    Ok(())
}
