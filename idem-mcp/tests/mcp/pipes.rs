//! The stdio transport's byte stream, on in-process pipes, with a proxy
//! between server and client that drops the response of every call that
//! ran.

use std::sync::Arc;

use idem_core::{Idempotent, MemoryStore};
use idem_testing::{StoreKind, TestStore};
use rmcp::model::ErrorCode;
use rmcp::ServiceExt;
use serde_json::json;
use tokio::io::duplex;

use crate::support::{
    call, dropping_proxy, error_kind, replayed, send, send_until_answered, Client, Mailer, Wire,
};

/// A client connected to `server` over pipes, through the dropping proxy.
async fn connect(server: Mailer) -> (Client, Arc<Wire>) {
    const PIPE: usize = 1 << 16;
    let (client_out, server_in) = duplex(PIPE);
    let (server_out, proxy_in) = duplex(PIPE);
    let (proxy_out, client_in) = duplex(PIPE);
    let wire = Arc::new(Wire::default());
    tokio::spawn(dropping_proxy(proxy_in, proxy_out, Arc::clone(&wire)));
    tokio::spawn(async move {
        if let Ok(running) = server.serve((server_in, server_out)).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve((client_in, client_out)).await.expect("the client connects");
    (client, wire)
}

/// How many calls the drop test makes: `IDEM_MCP_CALLS`, or 1,000.
fn calls() -> usize {
    std::env::var("IDEM_MCP_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

/// `n` calls of `send_email`, each with an intent of its own, 16 at a
/// time; every response of a call that ran is dropped and the call sent
/// again. Returns after checking each answer.
async fn dropped_and_retried(server: Mailer, n: usize) {
    let effects = Arc::clone(&server.effects);
    let (client, wire) = connect(server).await;
    let client = Arc::new(client);
    let workers = (0..16).map(|w| {
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            for i in (w..n).step_by(16) {
                let params = call(
                    "send_email",
                    json!({"to": format!("user{i}@example.com"), "subject": "weekly report"}),
                    Some(&format!("weekly-report-{i}")),
                );
                let (answer, lost) = send_until_answered(&client, params).await;
                let result = answer.expect("the retry is answered with the result");
                assert_eq!(lost, 1, "call {i}: one response was dropped");
                assert_eq!(
                    replayed(&result),
                    Some(true),
                    "call {i}: the retry is a replay"
                );
                assert_eq!(
                    result.structured_content.as_ref().unwrap()["effect"],
                    1,
                    "call {i}: the replay is the first effect's result"
                );
            }
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await.unwrap();
    }
    assert_eq!(effects.duplicates(), 0, "no email was sent twice");
    assert_eq!(effects.total() as usize, n, "every email was sent");
    assert_eq!(
        wire.check_replays(),
        n,
        "every replay matched its original byte for byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_dropped_responses_retried_send_each_email_once() {
    let n = calls();
    dropped_and_retried(Mailer::new(Idempotent::new(MemoryStore::new())), n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_responses_are_replayed_from_every_store() {
    for kind in StoreKind::ALL {
        let Some(fresh) = kind.fresh().await else {
            continue;
        };
        let idem = Idempotent::from_arc(Arc::clone(&fresh.store));
        dropped_and_retried(Mailer::new(idem), 64).await;
        drop(fresh);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_intent_with_other_arguments_is_refused() {
    let server = Mailer::new(Idempotent::new(MemoryStore::new()));
    let effects = Arc::clone(&server.effects);
    let (client, _wire) = connect(server).await;
    let to_bob = json!({"to": "bob@example.com", "subject": "weekly report"});
    let (first, _) =
        send_until_answered(&client, call("send_email", to_bob, Some("report-118"))).await;
    first.expect("the first call runs");

    let to_eve = json!({"to": "eve@example.com", "subject": "weekly report"});
    let refused = send(&client, call("send_email", to_eve, Some("report-118")))
        .await
        .expect_err("other arguments under the same intent are refused");
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(error_kind(&refused), Some("mismatch"));
    assert!(
        refused.message.contains("did not run"),
        "{}",
        refused.message
    );
    assert_eq!(effects.total(), 1, "only Bob's email was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_intents_with_the_same_arguments_are_two_effects() {
    let server = Mailer::new(Idempotent::new(MemoryStore::new()));
    let effects = Arc::clone(&server.effects);
    let (client, wire) = connect(server).await;
    let args = json!({"to": "bob@example.com", "subject": "hello"});
    for intent in ["session-a/greet-bob", "session-b/greet-bob"] {
        for _ in 0..3 {
            let (answer, _) =
                send_until_answered(&client, call("send_email", args.clone(), Some(intent))).await;
            answer.expect("the call is answered");
        }
    }
    let sent = effects
        .sent
        .lock()
        .unwrap()
        .values()
        .copied()
        .collect::<Vec<_>>();
    assert_eq!(sent, vec![2], "the same email, sent once for each intent");
    assert_eq!(wire.check_replays(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_an_intent_is_refused_and_other_tools_pass_through() {
    let server = Mailer::new(Idempotent::new(MemoryStore::new()));
    let effects = Arc::clone(&server.effects);
    let (client, _wire) = connect(server).await;
    let refused = send(
        &client,
        call("send_email", json!({"to": "bob@example.com"}), None),
    )
    .await
    .expect_err("no intent, no effect");
    assert_eq!(error_kind(&refused), Some("intent_required"));
    assert!(
        refused.message.contains("io.idem/intent"),
        "{}",
        refused.message
    );
    assert_eq!(effects.total(), 0);

    // A tool without an effect runs on every call and is not marked.
    for _ in 0..2 {
        let result = send(&client, call("whoami", json!({}), None))
            .await
            .unwrap();
        assert_eq!(replayed(&result), None);
    }
    assert_eq!(effects.total(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_runs_once_after_twenty_retries() {
    let server = Mailer::new(Idempotent::new(MemoryStore::new()));
    let (effects, tools) = (Arc::clone(&server.effects), server.tools.clone());
    let (client, wire) = connect(server).await;
    let wire_money = || {
        call(
            "wire_money",
            json!({"to": "ACME", "cents": 125_000}),
            Some("invoice-77"),
        )
    };

    let mut approval_id = None;
    for _ in 0..20 {
        let result = send(&client, wire_money())
            .await
            .expect("an approval request");
        let approval = &result.meta.as_ref().unwrap()["io.idem/approval"];
        assert_eq!(approval["status"], "pending");
        let id = approval["id"].as_str().unwrap().to_owned();
        assert_eq!(
            approval_id.get_or_insert(id.clone()),
            &id,
            "one approval for the intent"
        );
    }
    assert_eq!(effects.total(), 0, "nothing runs before the approval");
    let id = approval_id.unwrap();
    let pending = tools
        .pending(&id)
        .await
        .unwrap()
        .expect("the person sees the call");
    assert_eq!(
        (pending.tool.as_str(), pending.arguments["cents"].as_i64()),
        ("wire_money", Some(125_000))
    );
    assert_eq!(pending.decision, None);

    assert_eq!(
        tools.approve(&id).await.unwrap(),
        idem_mcp::Decision::Approved
    );
    assert_eq!(
        tools.approve(&id).await.unwrap(),
        idem_mcp::Decision::Approved,
        "approving twice is one approval"
    );
    for _ in 0..20 {
        let (answer, _) = send_until_answered(&client, wire_money()).await;
        let result = answer.expect("the approved call's result");
        assert_eq!(replayed(&result), Some(true));
    }
    assert_eq!(effects.total(), 1, "the money was wired once");
    assert_eq!(wire.check_replays(), 20);

    let changed = call(
        "wire_money",
        json!({"to": "ACME", "cents": 999_999}),
        Some("invoice-77"),
    );
    let refused = send(&client, changed)
        .await
        .expect_err("other arguments are refused");
    assert_eq!(error_kind(&refused), Some("mismatch"));
    assert_eq!(effects.total(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_never_runs() {
    let server = Mailer::new(Idempotent::new(MemoryStore::new()));
    let (effects, tools) = (Arc::clone(&server.effects), server.tools.clone());
    let (client, _wire) = connect(server).await;
    let wire_money = || {
        call(
            "wire_money",
            json!({"to": "Mallory", "cents": 5}),
            Some("scam-1"),
        )
    };
    let first = send(&client, wire_money()).await.unwrap();
    let id = first.meta.as_ref().unwrap()["io.idem/approval"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    assert!(matches!(
        tools.approve("idem-unknown").await,
        Err(idem_mcp::ApprovalError::Unknown(_))
    ));
    assert_eq!(tools.deny(&id).await.unwrap(), idem_mcp::Decision::Denied);
    assert_eq!(
        tools.approve(&id).await.unwrap(),
        idem_mcp::Decision::Denied,
        "the first decision stands"
    );
    for _ in 0..3 {
        let result = send(&client, wire_money()).await.unwrap();
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            result.meta.as_ref().unwrap()["io.idem/approval"]["status"],
            "denied"
        );
    }
    assert_eq!(effects.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_answers_in_progress_with_a_retry_hint() {
    let server = Mailer::new(Idempotent::new(MemoryStore::new()));
    let (effects, started, gate) = (
        Arc::clone(&server.effects),
        Arc::clone(&server.started),
        Arc::clone(&server.gate),
    );
    let (client, _wire) = connect(server).await;
    let client = Arc::new(client);
    let held = || {
        call(
            "send_email",
            json!({"to": "bob@example.com", "hold": true}),
            Some("slow-1"),
        )
    };
    let first = tokio::spawn({
        let client = Arc::clone(&client);
        async move { send_until_answered(&client, held()).await }
    });
    started.notified().await;

    let busy = send(&client, held())
        .await
        .expect_err("the first call holds the intent");
    assert_eq!(busy.code, idem_mcp::IN_PROGRESS);
    assert_eq!(error_kind(&busy), Some("in_progress"));
    let retry_after = busy.data.as_ref().unwrap()["io.idem/retryAfterMs"]
        .as_u64()
        .unwrap();
    assert!(retry_after > 0 && retry_after <= 60_000, "{retry_after}");
    assert!(busy.message.contains("call again"), "{}", busy.message);

    gate.notify_one();
    let (answer, lost) = first.await.unwrap();
    assert_eq!((replayed(&answer.unwrap()), lost), (Some(true), 1));
    assert_eq!(effects.total(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_is_waited_for_when_the_handle_waits() {
    let idem = Idempotent::new(MemoryStore::new()).with_wait(std::time::Duration::from_secs(30));
    let server = Mailer::new(idem);
    let (effects, started, gate) = (
        Arc::clone(&server.effects),
        Arc::clone(&server.started),
        Arc::clone(&server.gate),
    );
    let (client, _wire) = connect(server).await;
    let client = Arc::new(client);
    let held = || {
        call(
            "send_email",
            json!({"to": "bob@example.com", "hold": true}),
            Some("slow-2"),
        )
    };
    let first = tokio::spawn({
        let client = Arc::clone(&client);
        async move { send_until_answered(&client, held()).await }
    });
    started.notified().await;
    let second = tokio::spawn({
        let client = Arc::clone(&client);
        async move { send(&client, held()).await }
    });
    // The server reads requests in order: once a later call is answered,
    // the second one has reached it while the first still holds the key.
    // (Without waiting it would be refused as in progress.)
    send(&client, call("whoami", json!({}), None))
        .await
        .unwrap();
    gate.notify_one();
    let waited = second
        .await
        .unwrap()
        .expect("the second call waits for the first's result");
    assert_eq!(replayed(&waited), Some(true));
    let (answer, _) = first.await.unwrap();
    answer.unwrap();
    assert_eq!(effects.duplicates(), 0);
    assert_eq!(effects.total(), 2, "one email, one whoami");
}
