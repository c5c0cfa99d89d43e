//! The inbox's metrics, observed with a recording recorder over a real
//! SQLite queue: what the receiver answered and how each job ended, by
//! source, never by event id.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::HeaderMap;
use idem_core::{Idempotent, MemoryStore};
use idem_inbox::queue::Queue;
use idem_inbox::verify::SecretHeader;
use idem_inbox::{Backoff, Event, HandlerError, Outcome, Receiver, Worker, WorkerConfig};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Every counter increment recorded so far, as (name, labels, increment).
/// A snapshot drains the recorder, so each is kept here and every reader
/// (tests run in parallel) filters by its own labels.
/// One counter increment: name, labels, amount.
type Increment = (String, Vec<(String, String)>, u64);

fn counters() -> Vec<Increment> {
    static RECORDER: OnceLock<(Snapshotter, Mutex<Vec<Increment>>)> = OnceLock::new();
    let (snapshotter, kept) = RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        (snapshotter, Mutex::new(Vec::new()))
    });
    let mut kept = kept.lock().unwrap();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            kept.push((key.key().name().to_owned(), labels, n));
        }
    }
    kept.clone()
}

/// Counter values named `name` whose `source` label is `source`, by the
/// value of their `by` label; fails on any label that carries an event id.
fn counts(name: &str, source: &str, by: &str) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for (metric, labels, n) in counters() {
        if metric != name {
            continue;
        }
        let labels: HashMap<_, _> = labels.into_iter().collect();
        assert!(
            labels.values().all(|v| !v.contains("evt-")),
            "a label carries an event id: {labels:?}"
        );
        if labels.get("source").map(String::as_str) != Some(source) {
            continue;
        }
        *counts.entry(labels[by].clone()).or_default() += n;
    }
    counts
}

#[tokio::test]
async fn the_receiver_counts_what_it_answered_by_source() {
    counters();
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let receiver = Receiver::new(
        "metrics-receiver",
        SecretHeader::telegram(["tg-secret"]).unwrap(),
        Arc::clone(&queue),
    )
    .with_event_id_at("/update_id");
    let headers = |token: &'static str| {
        let mut headers = HeaderMap::new();
        headers.insert("x-telegram-bot-api-secret-token", token.parse().unwrap());
        headers
    };
    let body = br#"{"update_id":"evt-1"}"#;
    receiver.receive(&headers("tg-secret"), body).await.unwrap();
    receiver.receive(&headers("tg-secret"), body).await.unwrap();
    receiver
        .receive(&headers("forged"), body)
        .await
        .unwrap_err();
    receiver
        .receive(&headers("tg-secret"), br#"{"other":1}"#)
        .await
        .unwrap_err();

    let counts = counts("idem_inbox_received_total", "metrics-receiver", "result");
    assert_eq!(counts.get("enqueued"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("duplicate"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("unverified"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("no_event_id"), Some(&1), "{counts:?}");
}

#[tokio::test]
async fn the_worker_counts_each_job_by_how_it_ended() {
    counters();
    let (queue, _dir) = support::sqlite_queue().await;
    let queue: Arc<dyn Queue> = Arc::new(queue);
    let source = "metrics-worker";
    for id in ["evt-ok", "evt-flaky", "evt-poison"] {
        queue
            .enqueue(idem_inbox::queue::NewJob::new(source, id, b"{}".to_vec()))
            .await
            .unwrap();
    }
    let flaky = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&flaky);
    let handler = move |event: Event| {
        let seen = Arc::clone(&seen);
        async move {
            match event.id.as_str() {
                "evt-poison" => Err(HandlerError::permanent("never")),
                "evt-flaky" if seen.fetch_add(1, Ordering::SeqCst) == 0 => {
                    Err(HandlerError::retryable("once"))
                }
                _ => Ok(()),
            }
        }
    };
    let config = WorkerConfig::default()
        .with_lease(Duration::from_secs(5))
        .with_backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(1),
        ));
    let worker = Worker::new(
        Arc::clone(&queue),
        Idempotent::new(MemoryStore::new()),
        handler,
    )
    .with_config(config);
    let mut outcomes = Vec::new();
    for _ in 0..50 {
        outcomes.extend(worker.run_once(10).await.unwrap());
        if outcomes.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    outcomes.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(
        outcomes,
        [
            Outcome::Completed,
            Outcome::Completed,
            Outcome::DeadLettered,
            Outcome::Retried
        ]
    );

    let counts = counts("idem_inbox_jobs_total", source, "outcome");
    assert_eq!(counts.get("completed"), Some(&2), "{counts:?}");
    assert_eq!(counts.get("retried"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("dead_lettered"), Some(&1), "{counts:?}");
    assert_eq!(counts.len(), 3, "{counts:?}");
}

#[tokio::test]
async fn each_queue_counts_its_depth() {
    let (queue, _dir) = support::sqlite_queue().await;
    let mut queues: Vec<Arc<dyn Queue>> = vec![Arc::new(queue)];
    let mut _guard = None;
    if let Some(pool) = support::postgres_pool(4).await {
        let (queue, guard) = support::postgres_queue(pool).await;
        queues.push(Arc::new(queue));
        _guard = Some(guard);
    }
    for queue in queues {
        let before = queue.depth().await.unwrap().unwrap();
        for id in ["evt-d1", "evt-d2", "evt-d3"] {
            let source = format!("depth-{}", std::process::id());
            queue
                .enqueue(idem_inbox::queue::NewJob::new(source, id, b"{}".to_vec()))
                .await
                .unwrap();
        }
        assert_eq!(queue.depth().await.unwrap(), Some(before + 3), "{queue:?}");
        let claimed = queue.claim(1, Duration::from_secs(5)).await.unwrap();
        // A running job still counts; a done one no longer does.
        assert_eq!(queue.depth().await.unwrap(), Some(before + 3), "{queue:?}");
        assert!(queue.complete(&claimed[0]).await.unwrap().is_applied());
        assert_eq!(queue.depth().await.unwrap(), Some(before + 2), "{queue:?}");
    }
}
