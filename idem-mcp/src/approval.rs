//! The approval gate: a tool that must not act without a person.
//!
//! Three records, all under the call's key in the handle's store:
//!
//! * the call's key holds the pending approval, recorded by the first call
//!   as a settled outcome (`{"v": 1, "approval": {"tool", "arguments"}}`),
//!   and replayed to every retry; its fingerprint is the call's, so the
//!   same intent with other arguments is refused as for any effect;
//! * `Key::derive([key, "decision"])` holds the person's decision, recorded
//!   by [`IdemTools::approve`] or [`IdemTools::deny`]: the first decision
//!   stands, and deciding again answers with it;
//! * `Key::derive([key, "effect"])` holds the tool's result, run under
//!   `execute` by the first call after an approval, so it runs once
//!   however many calls come before or after.
//!
//! The approval's id is the call's client key. A pending approval lasts as
//! long as the handle's retention (24 h by default); after that a call
//! starts a new one.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use idem_core::store::State;
use idem_core::{Error, Key};
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, JsonObject};
use rmcp::ErrorData;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::meta;
use crate::tools::{refusal, IdemTools};

/// A person's decision on a gated call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Decision {
    /// The call may run; the next call of the intent runs the tool, once.
    Approved,
    /// The call never runs for this intent.
    Denied,
}

/// A gated call waiting for, or given, a decision.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PendingCall {
    /// The tool the agent called.
    pub tool: String,
    /// The arguments it called the tool with.
    pub arguments: JsonObject,
    /// The decision, once a person made one.
    pub decision: Option<Decision>,
}

/// Why an approval could not be read or decided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// No gated call with this approval id is recorded: the id is wrong,
    /// or the pending approval outlived the retention window.
    #[error("no call awaits approval under `{0}`")]
    Unknown(String),
    /// The store failed, or the id is not a valid key.
    #[error(transparent)]
    Idem(#[from] Error),
}

/// How long a decision waits for another decision on the same call that
/// is being recorded at that moment.
const DECISION_WAIT: Duration = Duration::from_secs(5);

impl IdemTools {
    /// Approves the gated call `approval_id` (the `id` of its approval
    /// request). The first decision stands: the answer is the decision in
    /// force, [`Decision::Denied`] if the call was denied before.
    pub async fn approve(&self, approval_id: &str) -> Result<Decision, ApprovalError> {
        self.decide(approval_id, Decision::Approved).await
    }

    /// Denies the gated call `approval_id`; the answer is the decision in
    /// force, as for [`approve`](IdemTools::approve).
    pub async fn deny(&self, approval_id: &str) -> Result<Decision, ApprovalError> {
        self.decide(approval_id, Decision::Denied).await
    }

    /// The gated call `approval_id`, for a person to look at before they
    /// decide; `None` when no such call is recorded.
    pub async fn pending(&self, approval_id: &str) -> Result<Option<PendingCall>, ApprovalError> {
        let key = self.idem.key(approval_id)?;
        let Some(record) = self.load(key.as_str()).await? else {
            return Ok(None);
        };
        let Some(approval) = record.get("approval") else {
            return Ok(None);
        };
        let tool = approval["tool"].as_str().unwrap_or_default().to_owned();
        let arguments = match &approval["arguments"] {
            Value::Object(arguments) => arguments.clone(),
            _ => JsonObject::new(),
        };
        let decision = self.decision(&key).await?;
        Ok(Some(PendingCall {
            tool,
            arguments,
            decision,
        }))
    }

    async fn decide(
        &self,
        approval_id: &str,
        decision: Decision,
    ) -> Result<Decision, ApprovalError> {
        if self.pending(approval_id).await?.is_none() {
            return Err(ApprovalError::Unknown(approval_id.to_owned()));
        }
        let key = self.idem.key(approval_id)?;
        let decided: Result<Decision, Error<Infallible>> = self
            .idem
            .clone()
            .with_wait(DECISION_WAIT)
            .execute(&decision_key(&key), &(), || async { Ok(decision) })
            .await;
        Ok(decided.map_err(Error::into_work_error)?)
    }

    /// The decision recorded for the call `key`, if any.
    async fn decision(&self, key: &Key) -> Result<Option<Decision>, Error> {
        let decision = self.idem.key(&decision_key(key))?;
        Ok(self
            .load(decision.as_str())
            .await?
            .and_then(|value| serde_json::from_value(value).ok()))
    }

    /// The settled outcome recorded under the storage key `key`.
    async fn load(&self, key: &str) -> Result<Option<Value>, Error> {
        let record = self
            .idem
            .store()
            .load(key)
            .await
            .map_err(|source| Error::Store {
                source,
                when: idem_core::When::BeforeWork,
            })?;
        Ok(record
            .filter(|record| record.state == State::Completed)
            .and_then(|record| serde_json::from_slice(&record.payload).ok()))
    }

    /// A gated call: the pending approval, then the decision, then the
    /// tool, once.
    pub(crate) async fn gate<W, Fut>(
        &self,
        tool: &str,
        key: &Key,
        client_key: &str,
        arguments: &JsonObject,
        body: &Value,
        work: W,
    ) -> Result<CallToolResponse, ErrorData>
    where
        W: FnOnce() -> Fut + Send,
        Fut: Future<Output = Result<CallToolResponse, ErrorData>> + Send,
    {
        let pending = json!({ "v": 1, "approval": { "tool": tool, "arguments": arguments } });
        let recorded: Result<Value, Error<Infallible>> = self
            .idem
            .execute(client_key, body, || async { Ok(pending) })
            .await;
        recorded.map_err(|error| refusal(tool, error, false))?;
        let decision = self
            .decision(key)
            .await
            .map_err(|error| refusal(tool, error, false))?;
        match decision {
            None => Ok(approval_request(tool, client_key, None)),
            Some(Decision::Denied) => {
                Ok(approval_request(tool, client_key, Some(Decision::Denied)))
            }
            Some(Decision::Approved) => {
                let effect = Key::derive(&[key.as_str(), "effect"]);
                self.run(tool, &effect, client_key, body, work).await
            }
        }
    }
}

fn decision_key(key: &Key) -> String {
    Key::derive(&[key.as_str(), "decision"])
}

/// The answer to a gated call that may not run (yet): a result the model
/// reads and passes on to the person.
fn approval_request(tool: &str, id: &str, decision: Option<Decision>) -> CallToolResponse {
    let (mut result, status) = match decision {
        None => (
            CallToolResult::success(vec![ContentBlock::text(format!(
                "`{tool}` needs a person's approval before it runs, and it has not run. \
                 Approval id: {id}. Tell the user what this call will do and that it awaits \
                 their approval; once they have approved it, call `{tool}` again with the same \
                 arguments and intent to carry it out (it runs once, however often it is called)."
            ))]),
            "pending",
        ),
        Some(_) => (
            CallToolResult::error(vec![ContentBlock::text(format!(
                "A person declined this call of `{tool}` (approval id {id}); it did not run and \
                 will not run for this intent. Do not call it again for this intent."
            ))]),
            "denied",
        ),
    };
    meta::set(
        &mut result.meta,
        meta::APPROVAL,
        json!({ "id": id, "status": status }),
    );
    meta::set(&mut result.meta, meta::CALL_KEY, Value::from(id));
    result.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_are_stored_as_words() {
        assert_eq!(
            serde_json::to_value(Decision::Approved).unwrap(),
            "approved"
        );
        assert_eq!(
            serde_json::from_value::<Decision>(json!("denied")).unwrap(),
            Decision::Denied
        );
    }
}
