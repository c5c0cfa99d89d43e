//! The `idem-inbox` command against a real SQLite queue file.

mod support;

use std::process::Command;
use std::time::Duration;

use idem_inbox::queue::{JobState, NewJob, Queue, SqliteQueue};

fn cli(path: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_idem-inbox"))
        .arg("--queue")
        .arg(path)
        .args(args)
        .output()
        .expect("run idem-inbox");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_inspects_and_requeues_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let queue = SqliteQueue::open(&path).await.unwrap();
    let id = queue
        .enqueue(NewJob::new(
            "stripe",
            "evt_9",
            b"{\"id\":\"evt_9\"}".to_vec(),
        ))
        .await
        .unwrap()
        .id()
        .clone();
    queue
        .enqueue(NewJob::new("stripe", "evt_ok", Vec::new()))
        .await
        .unwrap();
    let jobs = queue.claim(2, Duration::from_secs(30)).await.unwrap();
    let (dead, ok): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|j| j.id == id);
    assert!(queue
        .retry(&dead[0], Duration::ZERO, "timeout")
        .await
        .unwrap()
        .is_applied());
    let again = queue
        .claim(1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    assert!(queue
        .dead_letter(&again, "card API said 400")
        .await
        .unwrap()
        .is_applied());
    assert!(queue.complete(&ok[0]).await.unwrap().is_applied());

    let (success, out, _) = cli(&path, &["dead-letters"]);
    assert!(success);
    assert_eq!(out, format!("{id}\tstripe\tevt_9\t2\tcard API said 400\n"));

    let (success, out, _) = cli(&path, &["inspect", id.as_str()]);
    assert!(success);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["state"], "dead");
    assert_eq!(json["history"][0]["error"], "timeout");
    assert_eq!(json["history"][1]["error"], "card API said 400");
    assert_eq!(json["payload"], "{\"id\":\"evt_9\"}");

    let (success, out, _) = cli(&path, &["requeue", id.as_str()]);
    assert!(success, "{out}");
    assert_eq!(
        queue.inspect(&id).await.unwrap().unwrap().state,
        JobState::Pending
    );

    let (success, _, err) = cli(&path, &["requeue", id.as_str()]);
    assert!(!success);
    assert!(err.contains("is not a dead letter"), "{err}");
    let (success, _, err) = cli(&path, &["inspect", "12345"]);
    assert!(!success);
    assert!(err.contains("no job 12345"), "{err}");
}
