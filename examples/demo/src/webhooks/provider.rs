//! The webhooks demo's fake provider: signs events the Standard Webhooks
//! way and delivers them to the receiver, resending some (at once, racing
//! the first delivery, or after a pause, as after a slow answer), and
//! mixing in forgeries and stale deliveries that must be refused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_inbox::verify::StandardWebhooks;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The secret the provider and the receiver share.
pub(crate) const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// Another secret: what a forger signs with.
const FORGER: &str = "whsec_Zm9yZ2VyLXNlY3JldC1ub3QtdGhlLXJlYWwtb25l";

/// What the provider planned for one event.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    pub(crate) id: String,
    pub(crate) poison: bool,
}

/// What the provider saw.
#[derive(Debug, Default)]
pub(crate) struct Sent {
    /// Genuine deliveries made (first sends and resends).
    pub(crate) deliveries: u64,
    /// Forged or stale deliveries made.
    pub(crate) forged: u64,
    /// Forged or stale deliveries answered 401.
    pub(crate) forged_rejected: u64,
    /// Genuine deliveries answered "enqueued" / "duplicate".
    pub(crate) enqueued: u64,
    pub(crate) duplicates: u64,
    /// The job each event was acknowledged as (by event id).
    pub(crate) jobs: HashMap<String, String>,
    /// Genuine deliveries that got no 2xx after every try.
    pub(crate) failed: u64,
    /// Each genuine delivery's time to its acknowledgement.
    pub(crate) acks: Vec<Duration>,
}

/// The plan of `events` events for `run`: ids, payloads, resends.
pub(crate) fn plan(
    run: &str,
    events: usize,
    seed: u64,
    max_deliveries: usize,
    poison: bool,
) -> Vec<(Planned, String, usize, u32)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..events)
        .map(|n| {
            // About one event in 40 always fails (at least one per run of
            // eight or more): it must end in the dead letters.
            let poison = poison && n % 40 == 7;
            // A fifth of the events fail their first attempt or two.
            let flaky: u32 = if rng.random_range(0..5) == 0 {
                rng.random_range(1..=2)
            } else {
                0
            };
            // Most events come once; the others up to `max_deliveries`
            // times, fewer more often.
            let deliveries = if max_deliveries == 1 || rng.random_range(0..20) < 12 {
                1
            } else {
                rng.random_range(2..=max_deliveries)
            };
            let id = format!("evt_{run}_{n}");
            let body = format!(r#"{{"n":{n},"flaky":{flaky},"poison":{poison}}}"#);
            (Planned { id, poison }, body, deliveries, flaky)
        })
        .collect()
}

/// Delivers the plan to `url` with `senders` deliveries in flight at
/// once.
pub(crate) async fn deliver(
    url: &str,
    plan: &[(Planned, String, usize, u32)],
    senders: usize,
    seed: u64,
) -> Sent {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(senders)
        .build()
        .unwrap_or_default();
    let signer = StandardWebhooks::new([SECRET]).expect("a valid secret");
    let forger = StandardWebhooks::new([FORGER]).expect("a valid secret");
    let sent = Arc::new(Mutex::new(Sent::default()));
    let gate = Arc::new(tokio::sync::Semaphore::new(senders.max(1)));
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut tasks = tokio::task::JoinSet::new();
    for (index, (planned, body, deliveries, _)) in plan.iter().enumerate() {
        let now = unix_now();
        for delivery in 0..*deliveries {
            // A resend either races the first delivery or follows it after
            // a pause, as a provider does after a slow answer.
            let pause = if delivery == 0 || rng.random_bool(0.5) {
                Duration::ZERO
            } else {
                Duration::from_millis(rng.random_range(5..60))
            };
            let signature = signer.sign(&planned.id, now, body.as_bytes());
            let request = Request {
                client: client.clone(),
                url: url.to_owned(),
                id: planned.id.clone(),
                body: body.clone(),
                timestamp: now,
                signature,
                genuine: true,
            };
            tasks.spawn(send(request, pause, Arc::clone(&gate), Arc::clone(&sent)));
        }
        // Every tenth event is also forged (signed with another secret)
        // and replayed stale (signed right, an hour old).
        if index % 10 == 3 {
            let forged = Request {
                client: client.clone(),
                url: url.to_owned(),
                id: planned.id.clone(),
                body: body.replace("\"flaky\"", "\"forged\":true,\"flaky\""),
                timestamp: now,
                signature: forger.sign(&planned.id, now, body.as_bytes()),
                genuine: false,
            };
            let stale = Request {
                client: client.clone(),
                url: url.to_owned(),
                id: planned.id.clone(),
                body: body.clone(),
                timestamp: now - 3600,
                signature: signer.sign(&planned.id, now - 3600, body.as_bytes()),
                genuine: false,
            };
            for request in [forged, stale] {
                tasks.spawn(send(
                    request,
                    Duration::ZERO,
                    Arc::clone(&gate),
                    Arc::clone(&sent),
                ));
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    match Arc::try_unwrap(sent) {
        Ok(sent) => sent.into_inner().unwrap_or_else(|p| p.into_inner()),
        Err(shared) => std::mem::take(&mut *shared.lock().unwrap_or_else(|p| p.into_inner())),
    }
}

struct Request {
    client: reqwest::Client,
    url: String,
    id: String,
    body: String,
    timestamp: i64,
    signature: String,
    genuine: bool,
}

async fn send(
    request: Request,
    pause: Duration,
    gate: Arc<tokio::sync::Semaphore>,
    sent: Arc<Mutex<Sent>>,
) {
    tokio::time::sleep(pause).await;
    let Ok(_sender) = gate.acquire().await else {
        return;
    };
    // A provider resends on anything but a 2xx; a few tries stand in for
    // its hours of retries.
    for _ in 0..5 {
        let started = Instant::now();
        let answer = request
            .client
            .post(&request.url)
            .header("webhook-id", &request.id)
            .header("webhook-timestamp", request.timestamp.to_string())
            .header("webhook-signature", &request.signature)
            .header("content-type", "application/json")
            .body(request.body.clone())
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        let elapsed = started.elapsed();
        let status = answer.as_ref().map(reqwest::Response::status).ok();
        let json: Option<serde_json::Value> = match answer {
            Ok(response) => response.json().await.ok(),
            Err(_) => None,
        };
        if record(&sent, &request, elapsed, status, json) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sent.lock().unwrap_or_else(|p| p.into_inner()).failed += 1;
}

/// Counts one answer; whether the delivery is over (a 2xx, or any answer
/// to a forgery).
fn record(
    sent: &Mutex<Sent>,
    request: &Request,
    elapsed: Duration,
    status: Option<reqwest::StatusCode>,
    json: Option<serde_json::Value>,
) -> bool {
    let mut sent = sent.lock().unwrap_or_else(|p| p.into_inner());
    if !request.genuine {
        sent.forged += 1;
        if status.is_some_and(|s| s.as_u16() == 401) {
            sent.forged_rejected += 1;
        }
        return true;
    }
    sent.deliveries += 1;
    let (Some(status), Some(json)) = (status, json) else {
        return false;
    };
    if !status.is_success() {
        return false;
    }
    sent.acks.push(elapsed);
    match json["status"].as_str() {
        Some("enqueued") => sent.enqueued += 1,
        _ => sent.duplicates += 1,
    }
    if let Some(job) = json["job"].as_str() {
        sent.jobs.insert(request.id.clone(), job.to_owned());
    }
    true
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
