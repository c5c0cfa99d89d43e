//! The MCP server: three tools on rmcp's tool router, and `IdemTools`
//! between the client and the router.

use std::sync::{Arc, Mutex};

use idem::mcp::IdemTools;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, CallToolResponse, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;

/// An email to send.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct Email {
    /// The recipient's address.
    pub(crate) to: String,
    /// The subject line.
    pub(crate) subject: String,
    /// The message.
    pub(crate) body: String,
}

/// A newsletter for every subscriber.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub(crate) struct Newsletter {
    /// The subject line.
    pub(crate) subject: String,
    /// The message.
    pub(crate) body: String,
}

/// The mail server: what it sent is kept in its outbox (a real server
/// would call an email API here).
#[derive(Clone)]
pub(crate) struct Mailer {
    tool_router: ToolRouter<Mailer>,
    tools: IdemTools,
    outbox: Arc<Mutex<Vec<String>>>,
}

impl Mailer {
    /// A server whose `send_email` runs once per intent and whose
    /// `send_newsletter` runs once, after a person approved it.
    pub(crate) fn new(tools: IdemTools) -> Mailer {
        Mailer {
            tool_router: Mailer::tool_router(),
            tools: tools.effect("send_email").gated("send_newsletter"),
            outbox: Arc::default(),
        }
    }

    fn send(&self, line: String) -> usize {
        let mut outbox = self.outbox.lock().unwrap();
        outbox.push(line);
        outbox.len()
    }
}

#[tool_router]
impl Mailer {
    #[tool(
        description = "Send an email. Safe to retry: calling it again for the same intent sends nothing and returns the first call's result."
    )]
    async fn send_email(&self, Parameters(email): Parameters<Email>) -> String {
        let n = self.send(format!(
            "to {}: {} ({} bytes)",
            email.to,
            email.subject,
            email.body.len()
        ));
        format!("sent message {n} to {}", email.to)
    }

    #[tool(
        description = "Send a newsletter to every subscriber. Needs a person's approval: the first call returns an approval request to show the user."
    )]
    async fn send_newsletter(&self, Parameters(letter): Parameters<Newsletter>) -> String {
        let n = self.send(format!(
            "to all subscribers: {} ({} bytes)",
            letter.subject,
            letter.body.len()
        ));
        format!("newsletter sent as message {n}")
    }

    #[tool(description = "List the emails sent so far, oldest first.")]
    async fn outbox(&self) -> String {
        self.outbox.lock().unwrap().join("\n")
    }
}

#[tool_handler]
impl ServerHandler for Mailer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "Sends email. Clients: name each intent in the request's _meta \"io.idem/intent\"; \
             the same intent never sends twice.",
        )
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.tools
            .call(request, context, |request, context| {
                self.tool_router
                    .call(ToolCallContext::new(self, request, context))
            })
            .await
    }
}
