//! Streamable HTTP on loopback: rmcp's server in axum, rmcp's reqwest
//! client, and a middleware that drops the HTTP response of every call that
//! ran after the server sent it (the client's POST fails).

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use idem_core::{Idempotent, MemoryStore};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{ErrorData, ServiceError, ServiceExt};
use serde_json::json;

use crate::support::{call, inspect, replayed, Client, Mailer, Wire};

async fn drop_ran(State(wire): State<Arc<Wire>>, request: Request, next: Next) -> Response {
    let post = request.method() == http::Method::POST;
    let response = next.run(request).await;
    if !post {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = to_bytes(body, 1 << 20).await.expect("the response body");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    // A JSON body, or an event stream whose `data:` line is the message.
    let message = text
        .lines()
        .map(|line| line.strip_prefix("data: ").unwrap_or(line))
        .find(|line| line.starts_with('{'));
    match message.and_then(inspect) {
        Some((blanked, key, false)) => {
            wire.calls
                .lock()
                .unwrap()
                .insert(key, (blanked, Vec::new()));
            Response::builder()
                .status(http::StatusCode::BAD_GATEWAY)
                .body(Body::empty())
                .unwrap()
        }
        Some((blanked, key, true)) => {
            if let Some((_, replays)) = wire.calls.lock().unwrap().get_mut(&key) {
                replays.push(blanked);
            }
            Response::from_parts(parts, Body::from(bytes))
        }
        None => Response::from_parts(parts, Body::from(bytes)),
    }
}

/// A client connected to `server` over Streamable HTTP on loopback.
async fn connect(server: Mailer) -> (Client, Arc<Wire>) {
    let wire = Arc::new(Wire::default());
    let mut config = StreamableHttpServerConfig::default();
    config.json_response = true;
    let service: StreamableHttpService<Mailer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config);
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(from_fn_with_state(Arc::clone(&wire), drop_ran));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let transport = StreamableHttpClientTransport::from_uri(format!("http://{address}/mcp"));
    let client = ().serve(transport).await.expect("the client connects");
    (client, wire)
}

/// Sends `params` until an answer arrives; counts the failed sends.
async fn send_until_answered(
    client: &Client,
    params: CallToolRequestParams,
) -> (Result<CallToolResult, ErrorData>, u32) {
    let mut lost = 0;
    loop {
        match client.peer().call_tool(params.clone()).await {
            Ok(result) => return (Ok(result), lost),
            Err(ServiceError::McpError(error)) => return (Err(error), lost),
            Err(_) => lost += 1,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_http_responses_retried_send_each_email_once() {
    let server = Mailer::new(Idempotent::new(MemoryStore::new()));
    let effects = Arc::clone(&server.effects);
    let (client, wire) = connect(server).await;
    let client = Arc::new(client);
    let n = 200;
    let workers = (0..8).map(|w| {
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            for i in (w..n).step_by(8) {
                let params = call(
                    "send_email",
                    json!({"to": format!("user{i}@example.com")}),
                    Some(&format!("http-{i}")),
                );
                let (answer, lost) = send_until_answered(&client, params).await;
                let result = answer.expect("the retry is answered");
                assert_eq!(lost, 1, "call {i}: one response was dropped");
                assert_eq!(replayed(&result), Some(true));
            }
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await.unwrap();
    }
    assert_eq!(effects.duplicates(), 0);
    assert_eq!(effects.total(), n as u32);
    assert_eq!(wire.check_replays(), n);

    let refused = client
        .peer()
        .call_tool(call(
            "send_email",
            json!({"to": "eve@example.com"}),
            Some("http-0"),
        ))
        .await;
    match refused {
        Err(ServiceError::McpError(error)) => {
            assert_eq!(crate::support::error_kind(&error), Some("mismatch"))
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    assert_eq!(effects.total(), n as u32);
}
