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

/// Runs idem-inbox with `args`, the queue given by `via`: the flag, a
/// file, or the environment. Returns (success, stdout + stderr).
fn cli_given(queue: &str, via: &str, dir: &std::path::Path) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem-inbox"));
    command.env_remove("IDEM_INBOX_QUEUE");
    match via {
        "flag" => command.arg("--queue").arg(queue),
        "file" => {
            let file = dir.join("queue-url");
            std::fs::write(&file, format!("\n{queue}\n")).unwrap();
            command.arg("--queue-file").arg(file)
        }
        _ => command.env("IDEM_INBOX_QUEUE", queue),
    };
    let output = command
        .arg("dead-letters")
        .output()
        .expect("run idem-inbox");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

// Pins that a queue URL's password never reaches the terminal, whichever
// way the URL came and however opening it fails.
#[test]
fn a_queue_url_with_a_password_is_shown_with_stars_in_every_error() {
    let dir = tempfile::tempdir().unwrap();
    // Each fails without a connect timeout: an unknown role (or no
    // server), TLS required, a CA file that is missing, a bad sslmode, a
    // bad port.
    for url in [
        "postgres://idem_no_such_role:hunter2@127.0.0.1:5432/test",
        "postgres://idem_no_such_role:hunter2@127.0.0.1:5432/test?sslmode=require",
        "postgres://app:hunter2@localhost:5432/test?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        "postgres://app:hunter2@127.0.0.1:5432/test?sslmode=bogus",
        "postgresql://app:hunter2@127.0.0.1:notaport/test",
    ] {
        for via in ["flag", "file", "env"] {
            let (ok, text) = cli_given(url, via, dir.path());
            assert!(!ok, "{url} via {via}: {text}");
            assert!(!text.contains("hunter2"), "{url} via {via}: {text}");
            assert!(text.contains("app:***@") || text.contains("role:***@"), "{url} via {via}: {text}");
        }
    }
}

#[test]
fn the_queue_comes_from_the_flag_then_the_file_then_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("inbox.db");
    let (ok, text) = cli_given(db.to_str().unwrap(), "file", dir.path());
    assert!(ok && db.exists(), "{text}");
    let db = dir.path().join("env.db");
    let (ok, text) = cli_given(db.to_str().unwrap(), "env", dir.path());
    assert!(ok && db.exists(), "{text}");
    let output = Command::new(env!("CARGO_BIN_EXE_idem-inbox"))
        .env_remove("IDEM_INBOX_QUEUE")
        .arg("dead-letters")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && text.contains("--queue-file"),
        "{text}"
    );
    let output = Command::new(env!("CARGO_BIN_EXE_idem-inbox"))
        .args(["--queue-file", "/nonexistent/queue-url", "dead-letters"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("/nonexistent/queue-url"), "{text}");
    // The flag wins over the environment.
    let flagged = dir.path().join("flag.db");
    let output = Command::new(env!("CARGO_BIN_EXE_idem-inbox"))
        .env("IDEM_INBOX_QUEUE", dir.path().join("not-this.db"))
        .arg("--queue")
        .arg(&flagged)
        .arg("dead-letters")
        .output()
        .unwrap();
    assert!(output.status.success() && flagged.exists());
    assert!(!dir.path().join("not-this.db").exists());
}
