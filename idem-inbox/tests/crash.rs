//! The whole inbox under worker crashes: signed deliveries with resends go
//! through the receiver over a real socket, workers are killed at random
//! moments and restarted; every event ends handled, none is lost, and an
//! effect repeats only where a worker died inside its handler.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::backoff::Backoff;
use idem_core::{Idempotent, MemoryStore};
use idem_inbox::queue::{JobState, Queue};
use idem_inbox::verify::StandardWebhooks;
use idem_inbox::{Event, Receiver, Worker, WorkerConfig};
use rand::Rng;
use tokio::time::Instant;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// Events per run, and worker kills (`IDEM_INBOX_CRASH_EVENTS`,
/// `IDEM_INBOX_CRASH_KILLS`; small by default for CI).
fn sizes() -> (usize, usize) {
    let read = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    (
        read("IDEM_INBOX_CRASH_EVENTS", 200),
        read("IDEM_INBOX_CRASH_KILLS", 10),
    )
}

/// Runs the crash scenario; `idem` on the given store, or on a memory
/// store when `None`.
async fn run(queue: Arc<dyn Queue>, idem: Option<Idempotent>) {
    // On the memory store an outcome is recorded in the same instant the
    // handler returns: no round trip for a kill to land in.
    let records_in_process = idem.is_none();
    let (events, kills) = sizes();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let receiver = Receiver::new(
        "acme",
        StandardWebhooks::new([SECRET]).unwrap(),
        Arc::clone(&queue),
    );
    tokio::spawn(async move { axum::serve(listener, receiver.router()).await.unwrap() });

    // Effects, per event; which worker made each; and how many handler
    // runs were cut short.
    let effects: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let makers: Arc<Mutex<HashMap<String, Vec<usize>>>> = Arc::default();
    let next_worker = AtomicU32::new(0);
    let entered = Arc::new(AtomicU32::new(0));
    let left = Arc::new(AtomicU32::new(0));
    let idem = idem
        .unwrap_or_else(|| Idempotent::new(MemoryStore::new()))
        .with_lease(Duration::from_secs(2));
    let config = WorkerConfig::default()
        .with_concurrency(CONCURRENCY)
        .with_lease(Duration::from_secs(2))
        .with_poll(Duration::from_millis(5))
        .with_backoff(Backoff::new(
            Duration::from_millis(5),
            Duration::from_millis(50),
        ));
    let spawn_worker = || {
        let me = next_worker.fetch_add(1, Ordering::SeqCst) as usize;
        let (effects, makers, entered, left) = (
            Arc::clone(&effects),
            Arc::clone(&makers),
            Arc::clone(&entered),
            Arc::clone(&left),
        );
        let worker = Worker::new(Arc::clone(&queue), idem.clone(), move |e: Event| {
            let (effects, makers, entered, left) = (
                Arc::clone(&effects),
                Arc::clone(&makers),
                Arc::clone(&entered),
                Arc::clone(&left),
            );
            async move {
                entered.fetch_add(1, Ordering::SeqCst);
                let work = rand::rng().random_range(0..4);
                tokio::time::sleep(Duration::from_millis(work)).await;
                *effects.lock().unwrap().entry(e.id.clone()).or_default() += 1;
                makers
                    .lock()
                    .unwrap()
                    .entry(e.id.clone())
                    .or_default()
                    .push(me);
                left.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .with_config(config.clone());
        (
            me,
            tokio::spawn(async move { worker.run(std::future::pending()).await }),
        )
    };
    let mut workers: Vec<_> = (0..2).map(|_| spawn_worker()).collect();
    let mut killed = std::collections::HashSet::new();

    // The provider: every event once, a third of them resent.
    let client = reqwest::Client::new();
    let signer = StandardWebhooks::new([SECRET]).unwrap();
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut sends = Vec::new();
    // 32 senders at once, as a provider's delivery pool would be.
    let senders = Arc::new(tokio::sync::Semaphore::new(32));
    for n in 0..events {
        let deliveries = if n % 3 == 0 { 2 } else { 1 };
        for _ in 0..deliveries {
            let id = format!("evt_{n}");
            let body = format!(r#"{{"n":{n}}}"#);
            let request = client
                .post(&url)
                .header("webhook-id", &id)
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", signer.sign(&id, ts, body.as_bytes()))
                .body(body);
            let senders = Arc::clone(&senders);
            sends.push(tokio::spawn(async move {
                let _sender = senders.acquire().await.unwrap();
                let response = request.send().await.unwrap();
                assert!(response.status().is_success(), "{}", response.status());
                let json: serde_json::Value = response.json().await.unwrap();
                json["job"].as_str().unwrap().to_owned()
            }));
        }
    }

    // Kill a worker at a random moment, and start a fresh one, `kills` times.
    for _ in 0..kills {
        let pause = rand::rng().random_range(5..40);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = rand::rng().random_range(0..workers.len());
        let (id, victim) = workers.swap_remove(victim);
        victim.abort();
        killed.insert(id);
        workers.push(spawn_worker());
    }
    let mut jobs = std::collections::HashSet::new();
    for send in sends {
        jobs.insert(send.await.unwrap());
    }
    assert_eq!(jobs.len(), events, "resends of one event became two jobs");

    // Only jobs not yet seen done are looked at again, so the check does
    // not crowd the workers off the queue.
    let give_up = Instant::now() + Duration::from_secs(60);
    let mut waiting: Vec<String> = jobs.iter().cloned().collect();
    while !waiting.is_empty() && Instant::now() < give_up {
        let mut still = Vec::new();
        for job in waiting {
            let info = queue
                .inspect(&idem_inbox::queue::JobId::new(job.as_str()))
                .await
                .unwrap();
            if !info.is_some_and(|i| i.state == JobState::Done) {
                still.push(job);
            }
        }
        waiting = still;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = events - waiting.len();
    for (_, worker) in workers {
        worker.abort();
    }
    let mut unfinished = Vec::new();
    for job in &jobs {
        let info = queue
            .inspect(&idem_inbox::queue::JobId::new(job.as_str()))
            .await
            .unwrap();
        if !info.as_ref().is_some_and(|i| i.state == JobState::Done) && unfinished.len() < 5 {
            unfinished.push(format!("{info:?}"));
        }
    }
    let effects = effects.lock().unwrap();
    let made: u32 = effects.values().sum();
    let cut_short = entered.load(Ordering::SeqCst) - left.load(Ordering::SeqCst);
    let repeated = made - effects.len() as u32;
    eprintln!(
        "events {events}, kills {kills}: done {done}, effects {made}, repeated {repeated}, handlers cut short {cut_short}"
    );
    assert_eq!(
        done,
        events,
        "{} events were lost: {unfinished:#?}",
        events - done
    );
    assert_eq!(effects.len(), events, "an event never took effect");
    // A repeat is allowed only where a kill stopped a worker after a
    // handler's effect and before its outcome was recorded: every effect
    // but one of each event was made by a worker that was killed, and a
    // kill stops at most as many such runs as its worker runs at once.
    for (event, by) in makers.lock().unwrap().iter() {
        let by_survivors = by.iter().filter(|w| !killed.contains(*w)).count();
        assert!(
            by_survivors <= 1,
            "{event}: {by_survivors} effects by workers never killed ({by:?})"
        );
    }
    assert!(
        repeated as usize <= kills * CONCURRENCY,
        "{repeated} effects repeated after {kills} kills of workers running {CONCURRENCY} jobs"
    );
    if records_in_process {
        // So a repeat needs a kill inside a handler.
        assert!(
            repeated <= cut_short,
            "{repeated} effects repeated, but only {cut_short} handlers were cut short"
        );
    }
}

/// Handlers each worker runs at once.
const CONCURRENCY: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_lose_nothing_on_sqlite() {
    let (queue, _dir) = support::sqlite_queue().await;
    run(Arc::new(queue), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_lose_nothing_on_postgres() {
    let Some(pool) = support::postgres_pool(16).await else {
        return;
    };
    let (queue, _guard) = support::postgres_queue(pool).await;
    run(Arc::new(queue), None).await;
}

/// The same, with idem's records in a PostgreSQL store of their own beside
/// the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_lose_nothing_on_postgres_with_a_postgres_store() {
    on_a_postgres_store(false).await;
}

/// The same, with idem's claims in the queue's own commits: workers die
/// between a batch's claims and its handlers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_lose_nothing_on_postgres_with_shared_commits() {
    on_a_postgres_store(true).await;
}

/// The crash run with idem on a PostgreSQL store in the queue's database;
/// the queue claims idem's keys in its own commits when `shared`.
async fn on_a_postgres_store(shared: bool) {
    let Some(pool) = support::postgres_pool(16).await else {
        return;
    };
    let (store, _records) = support::postgres_store(pool.clone()).await;
    let (queue, _jobs) = support::postgres_queue(pool).await;
    let idem = Idempotent::new(store.clone());
    let queue = if shared {
        queue.with_store(store)
    } else {
        queue
    };
    run(Arc::new(queue), Some(idem)).await;
}
