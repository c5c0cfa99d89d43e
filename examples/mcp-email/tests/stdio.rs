//! The example's binary over stdio, with a client that retries: one email
//! per intent, and the newsletter sent once, after `mcp-email approve`
//! from another process.

use std::process::Stdio;

use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject};
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_mcp-email");

fn call(tool: &str, arguments: Value, intent: &str) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = arguments.as_object().cloned();
    let mut meta = RequestMetaObject::new();
    meta.insert("io.idem/intent".to_owned(), Value::from(intent));
    params.meta = Some(meta);
    params
}

fn text(result: &CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap()[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_calls_send_once_and_the_newsletter_waits_for_approval() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("calls.db").display());
    let mut child = Command::new(BIN)
        .args(["--store", &store, "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the example starts");
    let (stdout, stdin) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let client = ().serve((stdout, stdin)).await.expect("the client connects");

    let email = json!({"to": "bob@example.com", "subject": "Weekly report", "body": "118 orders"});
    let first = client
        .call_tool(call("send_email", email.clone(), "report-118"))
        .await
        .unwrap();
    let retry = client
        .call_tool(call("send_email", email, "report-118"))
        .await
        .unwrap();
    assert_eq!(text(&first), "sent message 1 to bob@example.com");
    assert_eq!(text(&retry), text(&first));
    assert_eq!(retry.meta.as_ref().unwrap()["io.idem/replayed"], true);

    let letter = json!({"subject": "December news", "body": "..."});
    let request = client
        .call_tool(call("send_newsletter", letter.clone(), "news-12"))
        .await
        .unwrap();
    let id = request.meta.as_ref().unwrap()["io.idem/approval"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let again = client
        .call_tool(call("send_newsletter", letter.clone(), "news-12"))
        .await
        .unwrap();
    assert_eq!(
        again.meta.as_ref().unwrap()["io.idem/approval"]["status"],
        "pending"
    );

    let approved = Command::new(BIN)
        .args(["--store", &store, "approve", &id])
        .output()
        .await
        .unwrap();
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&approved.stdout).trim(), "approved");

    for _ in 0..3 {
        let sent = client
            .call_tool(call("send_newsletter", letter.clone(), "news-12"))
            .await
            .unwrap();
        assert_eq!(text(&sent), "newsletter sent as message 2");
    }
    let outbox = client
        .call_tool(CallToolRequestParams::new("outbox"))
        .await
        .unwrap();
    assert_eq!(text(&outbox).lines().count(), 2, "{}", text(&outbox));
    client.cancel().await.unwrap();
}
