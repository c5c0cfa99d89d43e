//! The JSON-RPC errors a guarded call answers with, worded for the model
//! that reads them and carrying machine-readable fields in `data`.

use std::time::Duration;

use rmcp::model::ErrorCode;
use rmcp::ErrorData;
use serde_json::json;

use crate::meta;

/// The JSON-RPC error code of a call whose intent is still being carried
/// out by an earlier call: in JSON-RPC's range for server-defined errors.
pub const IN_PROGRESS: ErrorCode = ErrorCode(-32010);

/// The JSON-RPC error code of a store failure (`data` says whether the
/// tool ran).
pub const STORE_FAILED: ErrorCode = ErrorCode(-32011);

pub(crate) fn intent_required(tool: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "the tool `{tool}` has an effect and runs only for a call that names its intent: \
             the client must send `_meta.\"{}\"` (or `_meta.\"{}\"`); \
             calling again without it will be refused again",
            meta::INTENT,
            meta::KEY
        ),
        Some(json!({ meta::ERROR: "intent_required" })),
    )
}

pub(crate) fn invalid_intent(field: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!("`_meta.\"{field}\"` must be a string of 1 to 255 bytes"),
        Some(json!({ meta::ERROR: "invalid_intent" })),
    )
}

pub(crate) fn invalid_key(error: &idem_core::Error) -> ErrorData {
    ErrorData::internal_error(
        format!("the call's key cannot be used: {error}"),
        Some(json!({ meta::ERROR: "invalid_intent", meta::RAN: false })),
    )
}

pub(crate) fn mismatch(tool: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "this intent already called `{tool}` with other arguments, and that call stands; \
             the tool did not run again. To repeat the earlier call, send its arguments \
             unchanged; to do something new, start a new intent"
        ),
        Some(json!({ meta::ERROR: "mismatch", meta::RAN: false })),
    )
}

pub(crate) fn in_progress(tool: &str, retry_after: Duration) -> ErrorData {
    let ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
    ErrorData::new(
        IN_PROGRESS,
        format!(
            "an earlier call of `{tool}` for this intent is still running; do not start it \
             another way: call again with the same arguments in {:.1} s to get its result",
            retry_after.as_secs_f64().max(0.1)
        ),
        Some(json!({ meta::ERROR: "in_progress", meta::RETRY_AFTER_MS: ms, meta::RAN: false })),
    )
}

pub(crate) fn store(error: &str, ran: bool) -> ErrorData {
    let advice = if ran {
        "the tool ran but its result may not be recorded; do not call it again for this \
         intent before a person checks what happened"
    } else {
        "the tool did not run; calling again with the same arguments is safe"
    };
    ErrorData::new(
        STORE_FAILED,
        format!("{error}: {advice}"),
        Some(json!({ meta::ERROR: "store", meta::RAN: ran })),
    )
}

pub(crate) fn not_recorded(tool: &str, detail: &str) -> ErrorData {
    ErrorData::internal_error(
        format!(
            "`{tool}` ran but its result was not recorded ({detail}); do not call it again \
             for this intent before a person checks what happened"
        ),
        Some(json!({ meta::ERROR: "not_recorded", meta::RAN: true })),
    )
}

pub(crate) fn internal(detail: String) -> ErrorData {
    ErrorData::internal_error(
        detail,
        Some(json!({ meta::ERROR: "internal", meta::RAN: false })),
    )
}
