//! An MCP server whose `send_email` tool an agent can retry without sending
//! twice, and whose `send_newsletter` waits for a person's approval.
//!
//! ```text
//! mcp-email stdio                        # for an MCP host that starts it
//! mcp-email http --listen 127.0.0.1:8000 # Streamable HTTP at /mcp
//! mcp-email pending <id>                 # what a gated call will do
//! mcp-email approve <id>                 # or deny <id>
//! ```
//!
//! Every mode takes `--store URL` (default `sqlite:mcp-email.db`), so an
//! operator approves from another process, or another machine, through
//! the store the server uses. Over HTTP a person can also decide with
//! `POST /approvals/<id>/approve` (or `/deny`); `GET /approvals/<id>`
//! shows the call.

mod server;

use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Json;
use clap::{Parser, Subcommand};
use idem::mcp::{ApprovalError, Decision, IdemTools};
use idem::stores::StoreUrl;
use idem::Idempotent;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use serde_json::{json, Value};

use crate::server::Mailer;

#[derive(Parser)]
#[command(about = "An MCP email server whose tools are safe to retry")]
struct Cli {
    /// Where calls are recorded: sqlite:PATH, redis://…, postgres://…,
    /// mysql://… or memory.
    #[arg(long, global = true, default_value = "sqlite:mcp-email.db")]
    store: StoreUrl,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Serve MCP over stdin and stdout.
    Stdio,
    /// Serve MCP over Streamable HTTP at /mcp, and the approvals.
    Http {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
    },
    /// Show a call that awaits approval.
    Pending {
        /// The approval's id, from the approval request.
        id: String,
    },
    /// Approve a gated call: the agent's next call of it runs it, once.
    Approve {
        /// The approval's id.
        id: String,
    },
    /// Deny a gated call: it never runs for its intent.
    Deny {
        /// The approval's id.
        id: String,
    },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let store = cli.store.open().await?;
    let tools = IdemTools::new(Idempotent::from_arc(store).with_namespace("mcp-email"));
    match cli.mode {
        Mode::Stdio => {
            let running = Mailer::new(tools).serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
        }
        Mode::Http { listen } => {
            let mailer = Mailer::new(tools.clone());
            let mcp: StreamableHttpService<Mailer, LocalSessionManager> =
                StreamableHttpService::new(
                    move || Ok(mailer.clone()),
                    Default::default(),
                    StreamableHttpServerConfig::default(),
                );
            let app = axum::Router::new()
                .nest_service("/mcp", mcp)
                .route("/approvals/{id}", get(pending))
                .route("/approvals/{id}/approve", post(approve))
                .route("/approvals/{id}/deny", post(deny))
                .with_state(tools);
            let listener = tokio::net::TcpListener::bind(listen).await?;
            eprintln!("MCP at http://{listen}/mcp, approvals at http://{listen}/approvals/<id>");
            axum::serve(listener, app).await?;
        }
        Mode::Pending { id } => match tools.pending(&id).await? {
            Some(call) => println!(
                "{} {} ({})",
                call.tool,
                Value::Object(call.arguments),
                match call.decision {
                    None => "awaiting a decision",
                    Some(Decision::Approved) => "approved",
                    Some(_) => "denied",
                }
            ),
            None => return Err(format!("no call awaits approval under {id}").into()),
        },
        Mode::Approve { id } => println!("{}", word(tools.approve(&id).await?)),
        Mode::Deny { id } => println!("{}", word(tools.deny(&id).await?)),
    }
    Ok(())
}

fn word(decision: Decision) -> &'static str {
    match decision {
        Decision::Approved => "approved",
        _ => "denied",
    }
}

type Answer = (StatusCode, Json<Value>);

fn answer(result: Result<Value, ApprovalError>) -> Answer {
    match result {
        Ok(value) => (StatusCode::OK, Json(value)),
        Err(error @ ApprovalError::Unknown(_)) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": error.to_string() })),
        ),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": error.to_string() })),
        ),
    }
}

async fn pending(State(tools): State<IdemTools>, Path(id): Path<String>) -> Answer {
    answer(match tools.pending(&id).await {
        Ok(Some(call)) => Ok(json!({
            "tool": call.tool,
            "arguments": call.arguments,
            "decision": call.decision,
        })),
        Ok(None) => Err(ApprovalError::Unknown(id)),
        Err(error) => Err(error),
    })
}

async fn approve(State(tools): State<IdemTools>, Path(id): Path<String>) -> Answer {
    answer(tools.approve(&id).await.map(|d| json!({ "decision": d })))
}

async fn deny(State(tools): State<IdemTools>, Path(id): Path<String>) -> Answer {
    answer(tools.deny(&id).await.map(|d| json!({ "decision": d })))
}
