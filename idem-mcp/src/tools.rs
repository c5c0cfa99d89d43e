//! [`IdemTools`]: which tools have an effect, how a call's key is made, and
//! a call run once per key.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use idem_core::{Error, Fingerprint, Idempotent, Key};
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{json, Value};

use crate::meta::{self, Sent};
use crate::refuse;

/// Names the key scheme inside the derived key, so a later scheme yields
/// other keys instead of meeting these.
pub(crate) const KEY_DOMAIN: &str = "idem-mcp.v1";

/// What a guarded tool needs before its effect runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// Run once per key.
    Effect,
    /// Run once per key, and only after a person approved the call.
    Approval,
}

/// What a call of a tool with an effect gets when its request names no
/// intent (no `io.idem/intent` and no `io.idem/key` in `_meta`, or a
/// [key function](IdemTools::with_key) that returns `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingIntent {
    /// Refuse the call with a JSON-RPC error (the default): without an
    /// intent the server cannot tell a retry from a second request.
    #[default]
    Refuse,
    /// Key the call by the tool's name and its canonical arguments alone:
    /// any call with equal arguments within the retention window is the
    /// same effect. For clients that cannot set `_meta`, and only for
    /// tools where two equal calls can never mean two effects.
    Arguments,
}

/// One tool call as the key function sees it: what the orchestrator
/// controls, and the arguments.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    tool: &'a str,
    arguments: &'a JsonObject,
    intent: Option<&'a str>,
    client_key: Option<&'a str>,
}

impl<'a> Call<'a> {
    /// The tool's name.
    pub fn tool(&self) -> &'a str {
        self.tool
    }

    /// The call's arguments (an empty object when none were sent).
    pub fn arguments(&self) -> &'a JsonObject {
        self.arguments
    }

    /// `_meta."io.idem/intent"`, when sent.
    pub fn intent(&self) -> Option<&'a str> {
        self.intent
    }

    /// `_meta."io.idem/key"`, when sent.
    pub fn client_key(&self) -> Option<&'a str> {
        self.client_key
    }

    /// The arguments' fingerprint in hex: a SHA-256 of their canonical
    /// JSON (object keys sorted, no whitespace), so field order never
    /// changes it. For a key function that keys by some arguments.
    pub fn arguments_fingerprint(&self) -> String {
        // A JSON object always encodes.
        Fingerprint::of_json(self.arguments)
            .map(|fingerprint| fingerprint.to_string())
            .unwrap_or_default()
    }
}

/// The key of a call as [`IdemTools`] makes it unless told otherwise:
/// derived ([`Key::derive`]) from the tool's name and the intent and
/// client key the request's `_meta` carries; `None` when it carries
/// neither. The arguments are not part of it: they are the call's
/// fingerprint, so the same intent with other arguments is refused rather
/// than run as a new effect.
pub fn default_key(call: &Call<'_>) -> Option<String> {
    if call.intent.is_none() && call.client_key.is_none() {
        return None;
    }
    let mut parts = vec![KEY_DOMAIN, call.tool];
    if let Some(intent) = call.intent {
        parts.extend(["intent", intent]);
    }
    if let Some(key) = call.client_key {
        parts.extend(["key", key]);
    }
    Some(Key::derive(&parts))
}

type KeyFn = dyn Fn(&Call<'_>) -> Option<String> + Send + Sync;

/// Runs each call of a tool with an effect once per intent, and replays
/// its recorded result to every retry.
///
/// A server composes it in its `call_tool`, around whatever runs the
/// tools (rmcp's `ToolRouter`, a `match`); calls of tools not marked with
/// [`effect`](IdemTools::effect) or [`gated`](IdemTools::gated) pass
/// through untouched. It is cheap to clone.
#[derive(Clone)]
pub struct IdemTools {
    pub(crate) idem: Idempotent,
    guards: Arc<HashMap<String, Guard>>,
    key: Arc<KeyFn>,
    missing_intent: MissingIntent,
    remember_tool_errors: bool,
}

impl fmt::Debug for IdemTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdemTools")
            .field("idem", &self.idem)
            .field("guards", &self.guards)
            .field("missing_intent", &self.missing_intent)
            .field("remember_tool_errors", &self.remember_tool_errors)
            .finish_non_exhaustive()
    }
}

/// An error the work hands back so that the key is released: a result
/// that is not recorded, passed on to the client as it is.
struct Passed(Box<Result<CallToolResponse, ErrorData>>);

impl IdemTools {
    /// Guards no tool yet; records go to `idem`'s store, in its namespace
    /// and scope, with its lease, retention and waiting.
    pub fn new(idem: Idempotent) -> IdemTools {
        IdemTools {
            idem,
            guards: Arc::new(HashMap::new()),
            key: Arc::new(default_key),
            missing_intent: MissingIntent::Refuse,
            remember_tool_errors: false,
        }
    }

    /// Marks `tool` as having an effect: each call runs once per key.
    pub fn effect(mut self, tool: impl Into<String>) -> IdemTools {
        Arc::make_mut(&mut self.guards).insert(tool.into(), Guard::Effect);
        self
    }

    /// Marks `tool` as having an effect that must not happen without a
    /// person's approval: the first call records a pending approval and
    /// answers with an approval request; the call after
    /// [`approve`](IdemTools::approve) runs the tool, once.
    pub fn gated(mut self, tool: impl Into<String>) -> IdemTools {
        Arc::make_mut(&mut self.guards).insert(tool.into(), Guard::Approval);
        self
    }

    /// Makes each call's client key with `key` instead of
    /// [`default_key`]. Return `None` when the call names no intent. Build
    /// the key from what the orchestrator controls (the intent, the
    /// client's key, the tool, chosen arguments), never from text the
    /// model writes freely, and keep the tool's name in it; return
    /// [`Key::derive`] of the parts to get a valid key of any length.
    pub fn with_key(
        mut self,
        key: impl Fn(&Call<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> IdemTools {
        self.key = Arc::new(key);
        self
    }

    /// What a call without an intent gets ([`MissingIntent::Refuse`] by
    /// default).
    pub fn with_missing_intent(mut self, missing: MissingIntent) -> IdemTools {
        self.missing_intent = missing;
        self
    }

    /// Whether a tool's error result (`isError: true`) is recorded and
    /// replayed like a success. By default it is not: the key is released
    /// and a retry runs the tool again, as [`Idempotent::execute`] does
    /// with the work's errors. Turn it on for tools whose errors can come
    /// after the effect.
    pub fn remember_tool_errors(mut self, remember: bool) -> IdemTools {
        self.remember_tool_errors = remember;
        self
    }

    /// The handle records go through.
    pub fn idempotent(&self) -> &Idempotent {
        &self.idem
    }

    /// Runs a `tools/call`: `next` runs the tool (call it with the request
    /// and context it is given); for a guarded tool it is called only when
    /// the tool should run, at most once per key while leases hold.
    ///
    /// Answers with the tool's result (`_meta."io.idem/replayed"` is
    /// `false` when it ran now, `true` when it was recorded before), an
    /// approval request, or a JSON-RPC error: the intent is missing, the
    /// intent already called the tool with other arguments, an earlier
    /// call is still running (with a retry hint), or the store failed.
    pub async fn call<F, Fut>(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        next: F,
    ) -> Result<CallToolResponse, ErrorData>
    where
        F: FnOnce(CallToolRequestParams, RequestContext<RoleServer>) -> Fut + Send,
        Fut: Future<Output = Result<CallToolResponse, ErrorData>> + Send,
    {
        let Some(&guard) = self.guards.get(request.name.as_ref()) else {
            return next(request, context).await;
        };
        let sent = Sent::read(&context.meta, request.meta.as_ref())?;
        let tool = request.name.clone().into_owned();
        let arguments = request.arguments.clone().unwrap_or_default();
        let call = Call {
            tool: &tool,
            arguments: &arguments,
            intent: sent.intent.as_deref(),
            client_key: sent.key.as_deref(),
        };
        let client_key = match ((self.key)(&call), self.missing_intent) {
            (Some(key), _) => key,
            (None, MissingIntent::Arguments) => Key::derive(&[
                KEY_DOMAIN,
                &tool,
                "arguments",
                &call.arguments_fingerprint(),
            ]),
            (None, MissingIntent::Refuse) => return Err(refuse::intent_required(&tool)),
        };
        let full = self
            .idem
            .key(&client_key)
            .map_err(|e| refuse::invalid_key(&e))?;
        let body = json!({ "tool": tool, "arguments": arguments });
        let work = move || next(request, context);
        match guard {
            Guard::Effect => self.run(&tool, &client_key, &client_key, &body, work).await,
            Guard::Approval => {
                self.gate(&tool, &full, &client_key, &arguments, &body, work)
                    .await
            }
        }
    }

    /// Runs `work` once under `record_key` and answers with its recorded
    /// result, marked with `call_key`.
    pub(crate) async fn run<W, Fut>(
        &self,
        tool: &str,
        record_key: &str,
        call_key: &str,
        body: &Value,
        work: W,
    ) -> Result<CallToolResponse, ErrorData>
    where
        W: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<CallToolResponse, ErrorData>> + Send,
    {
        let ran = AtomicBool::new(false);
        let remember = self.remember_tool_errors;
        let outcome = self
            .idem
            .execute(record_key, body, || async {
                ran.store(true, Ordering::Relaxed);
                match work().await {
                    Ok(CallToolResponse::Complete(result))
                        if remember || result.is_error != Some(true) =>
                    {
                        record_result(tool, result, call_key)
                    }
                    other => Err(Passed(Box::new(other))),
                }
            })
            .await;
        let ran = ran.load(Ordering::Relaxed);
        match outcome {
            Ok(recorded) => answer(tool, recorded, !ran),
            Err(Error::Work(Passed(passed))) => *passed,
            Err(error) => Err(refusal(tool, error, ran)),
        }
    }
}

/// The recorded form of a result: versioned, with the call's key in its
/// `_meta`, so the call that ran and every replay decode the same value.
fn record_result(tool: &str, mut result: CallToolResult, call_key: &str) -> Result<Value, Passed> {
    meta::set(&mut result.meta, meta::CALL_KEY, Value::from(call_key));
    match serde_json::to_value(&result) {
        Ok(result) => Ok(json!({ "v": 1, "result": result })),
        // Not recordable: the client gets an error that says the tool ran.
        Err(e) => Err(Passed(Box::new(Err(refuse::not_recorded(
            tool,
            &format!("its result cannot be encoded as JSON: {e}"),
        ))))),
    }
}

/// The client's answer from a recorded result.
fn answer(tool: &str, recorded: Value, replayed: bool) -> Result<CallToolResponse, ErrorData> {
    let result = match recorded {
        Value::Object(mut object) if object.get("v") == Some(&Value::from(1)) => {
            object.remove("result")
        }
        _ => None,
    };
    let mut result: CallToolResult = result
        .and_then(|result| serde_json::from_value(result).ok())
        .ok_or_else(|| {
            refuse::internal(format!(
                "the recorded result of `{tool}` is not one this server can read; the tool did \
                 not run again"
            ))
        })?;
    meta::set(&mut result.meta, meta::REPLAYED, Value::Bool(replayed));
    Ok(result.into())
}

/// The JSON-RPC error for an `execute` that did not give an outcome.
pub(crate) fn refusal<E>(tool: &str, error: Error<E>, ran: bool) -> ErrorData {
    match error {
        Error::Mismatch => refuse::mismatch(tool),
        Error::InProgress { retry_after } => refuse::in_progress(tool, retry_after),
        Error::Store { source, when } => {
            let detail = source.to_string();
            let error: Error<Infallible> = Error::Store { source, when };
            refuse::store(&format!("{error} ({detail})"), ran || error.work_ran())
        }
        Error::LeaseLost => refuse::not_recorded(
            tool,
            "its lease lapsed and another call took the intent over",
        ),
        Error::Encode(e) if ran => refuse::not_recorded(tool, &e.to_string()),
        Error::InvalidKey(e) => refuse::invalid_key(&Error::InvalidKey(e)),
        other => refuse::internal(format!(
            "`{tool}` could not be run safely: {}",
            describe(&other)
        )),
    }
}

fn describe<E>(error: &Error<E>) -> String {
    match error {
        Error::Decode(e) => format!("a recorded outcome does not decode: {e}"),
        Error::Encode(e) => format!("the call cannot be encoded as JSON: {e}"),
        Error::Remembered(value) => format!("an earlier failure is recorded: {value}"),
        Error::Steps(e) => e.to_string(),
        _ => "an unexpected answer from the idempotency layer".to_owned(),
    }
}
