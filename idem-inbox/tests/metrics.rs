//! The inbox's metrics, observed with a recording recorder over a real
//! SQLite queue: what the receiver answered and how each job ended, by
//! source, never by event id.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::HeaderMap;
use idem_core::backoff::Backoff;
use idem_core::{Idempotent, MemoryStore};
use idem_inbox::queue::Queue;
use idem_inbox::verify::SecretHeader;
use idem_inbox::{Event, HandlerError, Outcome, Receiver, Worker, WorkerConfig};
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
    enqueue(&*queue, source, &["evt-ok", "evt-flaky", "evt-poison"]).await;
    let (outcomes, _) =
        settle_all(Arc::clone(&queue), Idempotent::new(MemoryStore::new()), 4).await;
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

/// Enqueues the events `ids` of `source`, each with the payload `{}`.
async fn enqueue(queue: &dyn Queue, source: &str, ids: &[&str]) {
    for id in ids {
        queue
            .enqueue(idem_inbox::queue::NewJob::new(source, *id, b"{}".to_vec()))
            .await
            .unwrap();
    }
}

/// Total of the counter `name` for `source`.
fn total(name: &str, source: &str) -> u64 {
    counters()
        .into_iter()
        .filter(|(metric, labels, _)| {
            metric == name && labels.iter().any(|(k, v)| k == "source" && v == source)
        })
        .map(|(_, _, n)| n)
        .sum()
}

/// Runs every job of `source` on `queue` to its settlement through
/// `run_once`, with a handler that fails "evt-flaky" once and "evt-poison"
/// for good; returns the outcomes and the handler's runs per event.
async fn settle_all(
    queue: Arc<dyn Queue>,
    idem: Idempotent,
    expected: usize,
) -> (Vec<Outcome>, HashMap<String, u32>) {
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = Arc::clone(&runs);
    let handler = move |event: Event| {
        let seen = Arc::clone(&seen);
        async move {
            let runs = {
                let mut seen = seen.lock().unwrap();
                let runs = seen.entry(event.id.clone()).or_default();
                *runs += 1;
                *runs
            };
            match event.id.as_str() {
                "evt-poison" => Err(HandlerError::permanent("never")),
                "evt-flaky" if runs == 1 => Err(HandlerError::retryable("once")),
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
    let worker = Worker::new(queue, idem, handler).with_config(config);
    let mut outcomes = Vec::new();
    for _ in 0..200 {
        outcomes.extend(worker.run_once(10).await.unwrap());
        if outcomes.len() >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    outcomes.sort_by_key(|o| format!("{o:?}"));
    let runs = runs.lock().unwrap().clone();
    (outcomes, runs)
}

#[tokio::test]
async fn a_queue_sharing_idems_commits_claims_each_key_with_its_job() {
    counters();
    let Some(pool) = support::postgres_pool(8).await else {
        return;
    };
    let (store, _records) = support::postgres_store(pool.clone()).await;
    let (queue, _jobs) = support::postgres_queue(pool.clone()).await;
    let idem = Idempotent::new(store.clone());
    let source = "metrics-shared";
    // "evt-done" was handled already (its worker died before completing
    // the job): its outcome is recorded, and its key cannot be claimed.
    let before = |_: Event| async { Ok::<(), HandlerError>(()) };
    idem_inbox::worker::handle_once(
        &idem,
        &before,
        &Event::new(source, "evt-done", b"{}".to_vec()),
    )
    .await
    .unwrap();
    enqueue(
        &queue,
        source,
        &["evt-ok", "evt-flaky", "evt-poison", "evt-done"],
    )
    .await;
    let queue: Arc<dyn Queue> = Arc::new(queue.with_store(store));
    let (outcomes, runs) = settle_all(Arc::clone(&queue), idem, 5).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Completed,
            Outcome::Completed,
            Outcome::Completed,
            Outcome::DeadLettered,
            Outcome::Retried
        ]
    );
    // The recorded event replayed without running; the flaky one ran
    // again after its failure gave its key back.
    let want: HashMap<String, u32> = [("evt-ok", 1), ("evt-flaky", 2), ("evt-poison", 1)]
        .map(|(id, n)| (id.to_owned(), n))
        .into();
    assert_eq!(runs, want);
    // Every run's key was claimed in its job's claim: ok, poison, and the
    // flaky one twice; never the recorded one's.
    assert_eq!(total("idem_inbox_keys_claimed_with_jobs_total", source), 4);
    assert_eq!(queue.depth().await.unwrap(), Some(0));
}

#[tokio::test]
async fn a_worker_whose_idempotent_reads_another_store_keeps_the_records_apart() {
    counters();
    let Some(pool) = support::postgres_pool(8).await else {
        return;
    };
    let (queues_store, _records) = support::postgres_store(pool.clone()).await;
    let (workers_store, _others) = support::postgres_store(pool.clone()).await;
    let (queue, _jobs) = support::postgres_queue(pool.clone()).await;
    let source = "metrics-apart";
    enqueue(&queue, source, &["evt-ok", "evt-flaky", "evt-poison"]).await;
    let queue: Arc<dyn Queue> = Arc::new(queue.with_store(queues_store.clone()));
    let idem = Idempotent::new(workers_store.clone());
    let (outcomes, runs) = settle_all(Arc::clone(&queue), idem.clone(), 4).await;
    assert_eq!(
        outcomes,
        [
            Outcome::Completed,
            Outcome::Completed,
            Outcome::DeadLettered,
            Outcome::Retried
        ]
    );
    assert_eq!(runs.values().sum::<u32>(), 4, "{runs:?}");
    assert_eq!(total("idem_inbox_keys_claimed_with_jobs_total", source), 0);
    // The outcomes are where the worker's `Idempotent` reads them, and no
    // event's key is in the queue's store.
    use idem_core::store::Store;
    let key = idem.scoped(source).key("evt-ok").unwrap();
    assert!(workers_store.load(key.as_str()).await.unwrap().is_some());
    assert!(queues_store.load(key.as_str()).await.unwrap().is_none());
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
