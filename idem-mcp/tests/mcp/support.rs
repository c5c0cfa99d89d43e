//! What the tests share: an email server whose `send_email` tool counts its
//! effects, a client, and a byte-level proxy that drops responses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_core::Idempotent;
use idem_mcp::{meta, IdemTools};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject,
    RequestMetaObject, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceError};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::Notify;

/// The effects the server's tools had: one entry per email sent or money
/// wired, counted by message.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    pub(crate) sent: Mutex<HashMap<String, u32>>,
}

impl Effects {
    pub(crate) fn total(&self) -> u32 {
        self.sent.lock().unwrap().values().sum()
    }
    pub(crate) fn duplicates(&self) -> usize {
        self.sent
            .lock()
            .unwrap()
            .values()
            .filter(|&&n| n > 1)
            .count()
    }
}

/// An MCP server with `send_email` (an effect), `wire_money` (an effect
/// behind approval) and `whoami` (none).
#[derive(Clone)]
pub(crate) struct Mailer {
    pub(crate) tools: IdemTools,
    pub(crate) effects: Arc<Effects>,
    /// Notified when a call with `"hold": true` started its effect.
    pub(crate) started: Arc<Notify>,
    /// What such a call waits for before it returns.
    pub(crate) gate: Arc<Notify>,
}

impl Mailer {
    pub(crate) fn new(idem: Idempotent) -> Mailer {
        Mailer {
            tools: IdemTools::new(idem)
                .effect("send_email")
                .gated("wire_money"),
            effects: Arc::default(),
            started: Arc::default(),
            gate: Arc::default(),
        }
    }

    async fn run(&self, request: CallToolRequestParams) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let what = format!("{}:{}", request.name, Value::Object(arguments.clone()));
        let n = {
            let mut sent = self.effects.sent.lock().unwrap();
            let n = sent.entry(what).or_default();
            *n += 1;
            *n
        };
        if arguments.get("hold") == Some(&Value::Bool(true)) {
            self.started.notify_one();
            self.gate.notified().await;
        }
        // Yield, so concurrent calls interleave with the effect.
        tokio::task::yield_now().await;
        let mut result = CallToolResult::success(vec![ContentBlock::text(format!(
            "{} done for {}",
            request.name,
            arguments.get("to").and_then(Value::as_str).unwrap_or("?")
        ))]);
        result.structured_content = Some(json!({ "arguments": arguments, "effect": n }));
        Ok(result.into())
    }
}

impl ServerHandler for Mailer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.tools
            .call(request, context, |request, _| self.run(request))
            .await
    }
}

/// A `tools/call` request with `_meta."io.idem/intent"` when `intent` is
/// given.
pub(crate) fn call(tool: &str, arguments: Value, intent: Option<&str>) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    if let Value::Object(arguments) = arguments {
        params.arguments = Some(arguments);
    }
    if let Some(intent) = intent {
        let mut meta = RequestMetaObject::new();
        let object: &mut JsonObject = &mut meta;
        object.insert(meta::INTENT.to_owned(), Value::from(intent));
        params.meta = Some(meta);
    }
    params
}

pub(crate) type Client = RunningService<RoleClient, ()>;

/// What a call got: its result, or the JSON-RPC error.
pub(crate) async fn send(
    client: &Client,
    params: CallToolRequestParams,
) -> Result<CallToolResult, ErrorData> {
    match client.peer().call_tool(params).await {
        Ok(result) => Ok(result),
        Err(ServiceError::McpError(error)) => Err(error),
        Err(other) => panic!("the client failed: {other}"),
    }
}

pub(crate) fn replayed(result: &CallToolResult) -> Option<bool> {
    result.meta.as_ref()?.get(meta::REPLAYED)?.as_bool()
}

pub(crate) fn ran(error: &ErrorData) -> Option<bool> {
    error.data.as_ref()?.get(meta::RAN)?.as_bool()
}

pub(crate) fn error_kind(error: &ErrorData) -> Option<&str> {
    error.data.as_ref()?.get(meta::ERROR)?.as_str()
}

/// The code a dropped response is replaced with: what a client sees of a
/// request whose response never arrived.
pub(crate) const LOST: i32 = -32099;

/// The responses the proxy dropped, and the replays that answered their
/// retries, as the bytes of their JSON-RPC lines with the `id` blanked.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    /// By call key: the dropped original and the replays that followed.
    pub(crate) calls: Mutex<HashMap<String, (String, Vec<String>)>>,
}

impl Wire {
    /// Checks every replay against its original, byte for byte, with only
    /// the replay marker set the other way; returns how many were checked.
    pub(crate) fn check_replays(&self) -> usize {
        let calls = self.calls.lock().unwrap();
        let mut checked = 0;
        for (key, (original, replays)) in calls.iter() {
            assert!(
                !replays.is_empty(),
                "{key}: the dropped call was never replayed"
            );
            let marker = format!("\"{}\":false", meta::REPLAYED);
            assert_eq!(original.matches(&marker).count(), 1, "{original}");
            let expected = original.replace(&marker, &format!("\"{}\":true", meta::REPLAYED));
            for replay in replays {
                assert_eq!(
                    replay, &expected,
                    "{key}: the replay differs from the original"
                );
                checked += 1;
            }
        }
        checked
    }
}

/// The line with its JSON-RPC `id` blanked, and the call key and replay
/// marker of a tool result.
pub(crate) fn inspect(line: &str) -> Option<(String, String, bool)> {
    let message: Value = serde_json::from_str(line).ok()?;
    let meta = message.get("result")?.get("_meta")?;
    let key = meta.get(meta::CALL_KEY)?.as_str()?.to_owned();
    let replayed = meta.get(meta::REPLAYED)?.as_bool()?;
    let id = message.get("id")?.to_string();
    let blanked = line.replacen(&format!("\"id\":{id}"), "\"id\":_", 1);
    assert_ne!(
        blanked, line,
        "the id is not where it was looked for: {line}"
    );
    Some((blanked, key, replayed))
}

/// Forwards the server's lines to the client. Every response of a tool that
/// ran now (`io.idem/replayed: false`) is dropped after the server sent it,
/// and the client is told the request failed, as it is when a connection
/// breaks before the response arrives; every replay is kept for
/// [`Wire::check_replays`].
pub(crate) async fn dropping_proxy(
    from_server: DuplexStream,
    mut to_client: DuplexStream,
    wire: Arc<Wire>,
) {
    let mut lines = BufReader::new(from_server).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let forward = match inspect(&line) {
            Some((blanked, key, false)) => {
                let message: Value = serde_json::from_str(&line).unwrap();
                wire.calls
                    .lock()
                    .unwrap()
                    .insert(key, (blanked, Vec::new()));
                json!({"jsonrpc": "2.0", "id": message["id"], "error": {
                    "code": LOST, "message": "the response was lost"
                }})
                .to_string()
            }
            Some((blanked, key, true)) => {
                if let Some((_, replays)) = wire.calls.lock().unwrap().get_mut(&key) {
                    replays.push(blanked);
                }
                line
            }
            None => line,
        };
        if to_client.write_all(forward.as_bytes()).await.is_err()
            || to_client.write_all(b"\n").await.is_err()
        {
            break;
        }
    }
}

/// Sends `params` until it gets an answer that is not a lost response.
pub(crate) async fn send_until_answered(
    client: &Client,
    params: CallToolRequestParams,
) -> (Result<CallToolResult, ErrorData>, u32) {
    let mut lost = 0;
    loop {
        match send(client, params.clone()).await {
            Err(error) if error.code.0 == LOST => lost += 1,
            // A store that failed before the tool ran (a connection
            // timeout under load) says a retry is safe: a client retries.
            Err(error) if error.code == idem_mcp::STORE_FAILED && ran(&error) == Some(false) => {}
            answer => return (answer, lost),
        }
    }
}
