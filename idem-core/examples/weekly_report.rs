//! An orchestrator runs an "agent" that plans a weekly report: fetch the
//! data, write a summary (a paid model call), email Bob. The orchestrator
//! derives the operation's key from (report id, date) rather than letting
//! the model invent one, and runs each tool call as a durable step. The
//! first run is killed right after the summary was written; the re-run
//! resumes there: one email is sent, and the summary is not paid for twice.
//!
//! `cargo run -p idem-core --example weekly_report`

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Error, Idempotent, Key, MemoryStore, Steps};

/// The tools the agent may call; each counts what it costs.
#[derive(Default)]
struct Tools {
    fetches: AtomicU32,
    summaries_paid: AtomicU32,
    /// An email API that dedupes on its idempotency key, like most do.
    outbox: Mutex<HashMap<String, String>>,
}

impl Tools {
    async fn fetch_sales(&self, week: &str) -> Result<Vec<u32>, String> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        Ok(if week.is_empty() {
            vec![]
        } else {
            vec![120, 95, 143]
        })
    }

    async fn summarise(&self, sales: &[u32]) -> Result<String, String> {
        self.summaries_paid.fetch_add(1, Ordering::SeqCst);
        let total: u32 = sales.iter().sum();
        Ok(format!("{} orders this week, {total} units", sales.len()))
    }

    async fn email(&self, idempotency_key: &str, to: &str, body: &str) -> Result<String, String> {
        let mut outbox = self.outbox.lock().unwrap();
        outbox
            .entry(idempotency_key.to_owned())
            .or_insert_with(|| format!("to {to}: {body}"));
        Ok(format!("msg-{}", &idempotency_key[5..13]))
    }
}

/// The agent's plan, one step per tool call.
async fn weekly_report(
    steps: Steps,
    tools: Arc<Tools>,
    week: String,
    crash_after_summary: bool,
) -> Result<String, Error<String>> {
    let sales = steps
        .step("fetch-sales", || tools.fetch_sales(&week))
        .await?;
    let summary = steps
        .step("write-summary", || tools.summarise(&sales))
        .await?;
    if crash_after_summary {
        // The process dies here (in this example: the run hangs and is
        // dropped, which is what a kill leaves behind).
        std::future::pending::<()>().await;
    }
    let sent = steps
        .remote("email-bob", |key| {
            let (tools, summary) = (Arc::clone(&tools), summary.clone());
            async move { tools.email(&key, "bob@example.com", &summary).await }
        })
        .await?;
    Ok(sent)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Duration::from_millis(200);
    let idem = Idempotent::new(MemoryStore::new()).with_lease(lease);
    let tools = Arc::new(Tools::default());
    let (report, week) = ("report-118", "2026-11-30");
    let key = Key::derive(&[report, week]);
    let body = (report, week);

    let first = idem.execute_steps(&key, &body, |steps| {
        weekly_report(steps, Arc::clone(&tools), week.to_owned(), true)
    });
    assert!(tokio::time::timeout(lease * 2, first).await.is_err());
    println!("first run killed after the summary");
    tokio::time::sleep(lease).await; // its lease lapses

    let sent = idem
        .execute_steps(&key, &body, |steps| {
            weekly_report(steps, Arc::clone(&tools), week.to_owned(), false)
        })
        .await
        .expect("the re-run finishes");
    let emails = tools.outbox.lock().unwrap().len();
    let paid = tools.summaries_paid.load(Ordering::SeqCst);
    println!("re-run resumed: sent {sent}; emails to Bob: {emails}; summaries paid for: {paid}");
    assert_eq!((emails, paid), (1, 1));
    assert_eq!(tools.fetches.load(Ordering::SeqCst), 1);
}
