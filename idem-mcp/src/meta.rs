//! The `_meta` fields this crate reads from requests and writes on results.
//!
//! MCP's `_meta` key names take a reverse-DNS prefix and a slash; prefixes
//! whose second label is `modelcontextprotocol` or `mcp` are reserved, so
//! every field here is under `io.idem/`.

use rmcp::model::{JsonObject, RequestMetaObject};
use serde_json::Value;

use crate::refuse;

/// Request `_meta`: the orchestrator's id of what the agent means to do
/// ("send report 118 of 2026-11-30 to Bob"), stable across every retry of
/// that intent. A string of 1 to 255 bytes.
pub const INTENT: &str = "io.idem/intent";

/// Request `_meta`: an idempotency key the client made itself (for example
/// with [`Key::derive`](idem_core::Key::derive)); it is hashed into the
/// call's key with the tool's name, so one key can never reach another
/// tool's record. A string of 1 to 255 bytes.
pub const KEY: &str = "io.idem/key";

/// Result `_meta`: `true` when the result was recorded by an earlier call
/// and replayed, `false` on the call that ran the tool.
pub const REPLAYED: &str = "io.idem/replayed";

/// Result `_meta`: the client key the call ran under; for a tool behind an
/// approval gate it is also the approval's id.
pub const CALL_KEY: &str = "io.idem/callKey";

/// Result `_meta` of an approval request: `{"id": …, "status":
/// "pending" | "denied"}`.
pub const APPROVAL: &str = "io.idem/approval";

/// JSON-RPC error `data`: what idem refused, one of `"intent_required"`,
/// `"invalid_intent"`, `"mismatch"`, `"in_progress"`, `"store"`,
/// `"not_recorded"`, `"internal"`.
pub const ERROR: &str = "io.idem/error";

/// JSON-RPC error `data`: for `"in_progress"`, milliseconds to wait before
/// calling again.
pub const RETRY_AFTER_MS: &str = "io.idem/retryAfterMs";

/// JSON-RPC error `data`: whether the tool ran in this call (its effect
/// may have happened).
pub const RAN: &str = "io.idem/ran";

/// The intent and the client's key, read from the request's `_meta`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) intent: Option<String>,
    pub(crate) key: Option<String>,
}

impl Sent {
    /// Reads both fields from the request context's `_meta` (where rmcp
    /// moves it) or, failing that, from the params' own `_meta`.
    pub(crate) fn read(
        context: &RequestMetaObject,
        params: Option<&RequestMetaObject>,
    ) -> Result<Sent, rmcp::ErrorData> {
        let field = |name: &str| -> Result<Option<String>, rmcp::ErrorData> {
            let value = context
                .get(name)
                .or_else(|| params.and_then(|meta| meta.get(name)));
            match value {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() && s.len() <= 255 => Ok(Some(s.clone())),
                Some(_) => Err(refuse::invalid_intent(name)),
            }
        };
        Ok(Sent {
            intent: field(INTENT)?,
            key: field(KEY)?,
        })
    }
}

/// Sets `field` in a result's `_meta`.
pub(crate) fn set(meta: &mut Option<rmcp::model::MetaObject>, field: &str, value: Value) {
    let meta = meta.get_or_insert_with(rmcp::model::MetaObject::new);
    let object: &mut JsonObject = meta;
    object.insert(field.to_owned(), value);
}
