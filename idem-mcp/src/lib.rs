//! The MCP tools for idem: Model Context Protocol tool calls that an agent
//! can retry without repeating their effect.
//!
//! Retries happen for two reasons:
//!
//! * an agent that believes its first call failed calls the tool again;
//! * a transport that lost a response sends the request again.
//!
//! [`IdemTools`] runs each call of a tool with an effect under [`Idempotent::execute`](idem_core::Idempotent::execute).
//! The first call runs the tool and records its result.
//! Every retry of the same intent gets that result back, byte for byte, without running the tool.
//!
//! ```
//! use idem_core::{Idempotent, MemoryStore};
//! use idem_mcp::IdemTools;
//! use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
//! use rmcp::service::RequestContext;
//! use rmcp::{ErrorData, RoleServer, ServerHandler};
//!
//! struct Mailer {
//!     tools: IdemTools,
//! }
//!
//! impl Mailer {
//!     async fn send_email(&self, _request: CallToolRequestParams) -> Result<CallToolResponse, ErrorData> {
//!         Ok(CallToolResult::success(vec![ContentBlock::text("sent msg-1")]).into())
//!     }
//! }
//!
//! impl ServerHandler for Mailer {
//!     async fn call_tool(
//!         &self,
//!         request: CallToolRequestParams,
//!         context: RequestContext<RoleServer>,
//!     ) -> Result<CallToolResponse, ErrorData> {
//!         // Runs `send_email` once per intent; other tools pass through.
//!         self.tools
//!             .call(request, context, |request, _context| self.send_email(request))
//!             .await
//!     }
//! }
//!
//! let tools = IdemTools::new(Idempotent::new(MemoryStore::new()))
//!     .effect("send_email")
//!     .gated("wire_money");
//! let _server = Mailer { tools };
//! ```
//!
//! With rmcp's `#[tool_router]`, `next` is
//! `|request, context| self.tool_router.call(ToolCallContext::new(self, request, context))`
//! (see the `mcp-email` example).
//! Why compose in `call_tool`, not wrap the whole `ServerHandler`:
//!
//! * a wrapper would have to forward each of the handler's methods;
//! * those methods grow with every protocol revision;
//! * composing in `call_tool` is one line and leaves the rest of the server alone.
//!
//! # The key: the orchestrator's, never the model's
//!
//! The model writes a call's arguments.
//! The client (the orchestrator, the agent's host) writes its `_meta`.
//! The server makes a call's key from what the orchestrator controls.
//! By default, [`default_key`] derives it ([`Key::derive`](idem_core::Key::derive)) from the tool's name and these, whichever are sent:
//!
//! * `_meta."io.idem/intent"`: the orchestrator's id of what the agent means to do, stable across its retries;
//! * `_meta."io.idem/key"`: a key the client made itself.
//!
//! The canonical arguments are the call's fingerprint, not part of its key.
//! So:
//!
//! * a retry with the same intent and arguments replays the result, marked
//!   `_meta."io.idem/replayed": true` (`false` on the call that ran);
//! * the same intent with other arguments is refused with a JSON-RPC
//!   error (`-32602`) that tells the model the earlier call stands;
//! * another intent with the same arguments is another effect.
//!
//! [`IdemTools::with_key`] replaces the function.
//! It can key by chosen arguments as well, or by a session the orchestrator names.
//!
//! [`MissingIntent`] says what a call without an intent gets.
//! By default it is refused: without an intent, the server cannot tell a retry from a second request.
//! [`MissingIntent::Arguments`] keys it by its arguments instead.
//! That suits tools where two equal calls never mean two effects.
//!
//! The scope of [`Idempotent::scoped`](idem_core::Idempotent::scoped) keeps tenants apart.
//!
//! # Answers
//!
//! | situation | answer |
//! |---|---|
//! | first call | the tool's result, `io.idem/replayed: false`, `io.idem/callKey` |
//! | retry | the recorded result, `io.idem/replayed: true` |
//! | same intent, other arguments | JSON-RPC `-32602`, `data."io.idem/error": "mismatch"` |
//! | no intent | JSON-RPC `-32602`, `"intent_required"` |
//! | an earlier call still running | waits with [`Idempotent::with_wait`](idem_core::Idempotent::with_wait), else [`IN_PROGRESS`] (`-32010`) with `io.idem/retryAfterMs` |
//! | the store failed | [`STORE_FAILED`] (`-32011`) with `io.idem/ran` |
//! | the tool's error result (`isError`) or a JSON-RPC error | passed on, the key released: a retry runs the tool ([`IdemTools::remember_tool_errors`] records error results) |
//!
//! The messages are written for the model that reads them.
//! They say what happened, whether the tool ran, and what to do.
//! Some results are not a completed tool call: a request for more input, or a task.
//! Those are passed on, and the key is released.
//!
//! # The approval gate
//!
//! A tool marked [`gated`](IdemTools::gated) does not run on its first call.
//!
//! 1. The call records a pending approval.
//! 2. It answers with an approval request: `_meta."io.idem/approval": {"id", "status": "pending"}`,
//!    and text that asks the model to tell the user.
//! 3. A person looks at it with [`IdemTools::pending`].
//! 4. The person decides with [`IdemTools::approve`] or [`IdemTools::deny`].
//! 5. The first call of the intent after an approval runs the tool, once.
//!    Every later call replays its result.
//!
//! The [`approval`] module describes how the records are laid out.
//!
//! # Transports and stores
//!
//! The wrapper works on the handler.
//! So the transport is whatever rmcp serves: stdio, Streamable HTTP, any byte stream.
//! The store is any idem store, chosen by URL with `idem-stores`.
//! A Streamable HTTP server on several machines shares one store (Redis, PostgreSQL).
//! A retry that reaches another machine is then still a replay.
//!
//! TLS is not this crate's to do: it opens no connection and serves
//! nothing. A Streamable HTTP server gets TLS from its listener (axum
//! behind rustls, or a terminating proxy), and a client from its reqwest
//! (`rustls-tls`). The store's TLS comes from its URL, as the store crates
//! take it (`sslmode=verify-full`, `rediss://`).
#![forbid(unsafe_code)]

pub mod approval;
pub mod meta;
mod refuse;
mod tools;

pub use approval::{ApprovalError, Decision, PendingCall};
pub use refuse::{IN_PROGRESS, STORE_FAILED};
/// The rmcp this crate is built on, so a server can name the same version.
pub use rmcp;
pub use tools::{default_key, Call, IdemTools, MissingIntent};
