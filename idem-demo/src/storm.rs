//! The retry storm: many clients paying at once, each payment sent with
//! racing duplicates, dropped responses, retries and altered bodies, then
//! checked against the server's ledger.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use http::StatusCode;
use idem_core::Store;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::client::{Answer, ClientError, PaymentsClient};
use crate::ledger::Charge;
use crate::report::{bump, Report, Tally};
use crate::server::{RunningServer, DEFAULT_GATEWAY_LATENCY};
use crate::verify::check_ledger;

/// How hard a storm blows.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StormConfig {
    /// Clients paying at once.
    pub clients: usize,
    /// Distinct payments to make, one idempotency key each.
    pub payments: usize,
    /// Seeds each payment's plan (duplicates, drops, retries, amounts).
    pub seed: u64,
    /// How long a client waits for a response before it gives up and
    /// retries; some first attempts use [`drop_after`](Self::drop_after)
    /// instead.
    pub timeout: Duration,
    /// The short timeout that drops a response on purpose. It should be
    /// shorter than the server's gateway latency, so the request reaches
    /// the handler and the client hangs up while it runs.
    pub drop_after: Duration,
    /// How long a client keeps retrying one payment before giving up on it.
    pub give_up_after: Duration,
    /// Whether to draw a progress line on stderr while it runs.
    pub progress: bool,
}

impl Default for StormConfig {
    /// 32 clients, 500 payments, a random seed, a 10 s timeout, responses
    /// dropped after 2 ms, payments given up on after 30 s, no progress.
    fn default() -> StormConfig {
        StormConfig {
            clients: 32,
            payments: 500,
            seed: rand::rng().random(),
            timeout: Duration::from_secs(10),
            drop_after: Duration::from_millis(2),
            give_up_after: Duration::from_secs(30),
            progress: false,
        }
    }
}

/// The storm could not run or could not be checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StormError {
    /// The in-process server could not start or failed.
    #[error("the in-process server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The server did not answer its health check.
    #[error("the server at {url} is not healthy: {source}")]
    Unhealthy {
        /// The server's base URL.
        url: String,
        /// Why the health check failed.
        #[source]
        source: ClientError,
    },
    /// The ledger could not be read after the storm.
    #[error("could not list the charges made: {0}")]
    Ledger(#[source] ClientError),
}

/// What one payment does; drawn from the seed, so a seed replays the same
/// plans (though not the same timing).
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) key: String,
    pub(crate) amount: i64,
    pub(crate) currency: &'static str,
    /// Identical requests sent at once, racing for the key (1 = no race).
    racers: usize,
    /// Whether the first attempt hangs up before the response arrives.
    drop_first: bool,
    /// Identical requests sent one by one after the payment settled.
    retries: usize,
    /// Whether the key is then reused with another amount.
    altered: bool,
}

const CURRENCIES: [&str; 5] = ["EUR", "USD", "GBP", "JPY", "CHF"];

impl Plan {
    pub(crate) fn draw(seed: u64, run: &str, index: usize) -> Plan {
        let mut rng =
            StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Plan {
            key: format!("{}{index:06}", Plan::key_prefix(run)),
            amount: rng.random_range(100..100_000),
            currency: CURRENCIES[rng.random_range(0..CURRENCIES.len())],
            racers: if rng.random_bool(0.3) {
                rng.random_range(2..=4)
            } else {
                1
            },
            drop_first: rng.random_bool(0.2),
            retries: if rng.random_bool(0.4) {
                rng.random_range(1..=2)
            } else {
                0
            },
            altered: rng.random_bool(0.1),
        }
    }

    /// What every key of the storm `run` starts with.
    pub(crate) fn key_prefix(run: &str) -> String {
        format!("storm-{run}-")
    }

    fn body(&self, amount: i64) -> Bytes {
        Bytes::from(json!({ "amount": amount, "currency": self.currency }).to_string())
    }
}

struct Storm {
    client: PaymentsClient,
    config: StormConfig,
    tally: Tally,
}

/// Fires a retry storm at the payments API at `url` and checks the ledger
/// it leaves: every intended payment must be charged exactly once.
///
/// The storm's keys are unique to this run, so a server that has served
/// other traffic can be stormed again; only charges under this run's keys
/// are counted.
pub async fn run_storm(url: &str, config: &StormConfig) -> Result<Report, StormError> {
    let started = Instant::now();
    let storm = Arc::new(Storm {
        client: PaymentsClient::new(url, config.clients * 4),
        config: config.clone(),
        tally: Tally::default(),
    });
    storm
        .client
        .get_json::<serde_json::Value>("/healthz", config.timeout)
        .await
        .map_err(|source| StormError::Unhealthy {
            url: url.to_owned(),
            source,
        })?;

    let run = format!("{:08x}", rand::rng().random::<u32>());
    let plans: Arc<Vec<Plan>> = Arc::new(
        (0..config.payments)
            .map(|i| Plan::draw(config.seed, &run, i))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::with_capacity(config.clients);
    for _ in 0..config.clients.max(1) {
        let (storm, plans, next) = (Arc::clone(&storm), Arc::clone(&plans), Arc::clone(&next));
        clients.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(plan) = plans.get(index) else {
                    return seen;
                };
                seen.push((index, storm.pay(plan).await));
                bump(&storm.tally.settled);
            }
        }));
    }
    // On a terminal the line is redrawn in place; logs and CI get a line
    // every few seconds instead of a flood.
    let in_place = std::io::stderr().is_terminal();
    let progress = config.progress.then(|| {
        let storm = Arc::clone(&storm);
        let intended = config.payments;
        let every = Duration::from_millis(if in_place { 200 } else { 2000 });
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                storm.tally.progress(intended, in_place);
            }
        })
    });

    let mut seen: Vec<Vec<String>> = vec![Vec::new(); plans.len()];
    for client in clients {
        match client.await {
            Ok(client_seen) => {
                for (index, ids) in client_seen {
                    seen[index] = ids;
                }
            }
            // A client that panicked is a bug in the storm itself; its
            // payments must not be reported as checked.
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(_) => {}
        }
    }
    if let Some(progress) = progress {
        progress.abort();
        storm.tally.progress(config.payments, in_place);
        if in_place {
            eprintln!();
        }
    }

    let charges = storm
        .client
        .charges(config.timeout)
        .await
        .map_err(StormError::Ledger)?;
    let mut report = storm
        .tally
        .to_report(url.to_owned(), config.payments, Duration::ZERO);
    check_ledger(&mut report, &run, &plans, &seen, &charges);
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Starts the payments API over `store` on a free port of 127.0.0.1, fires
/// a storm at it, and stops it: a storm that needs nothing else running.
pub async fn storm_in_process(
    store: Arc<dyn Store>,
    config: &StormConfig,
) -> Result<Report, StormError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = RunningServer::start(addr, store, DEFAULT_GATEWAY_LATENCY)
        .await
        .map_err(StormError::Serve)?;
    let report = run_storm(&server.url(), config).await;
    server.stop().await.map_err(StormError::Serve)?;
    report
}

impl Storm {
    /// Makes one payment as its plan says; returns the charge ids the
    /// server answered with.
    async fn pay(&self, plan: &Plan) -> Vec<String> {
        let deadline = Instant::now() + self.config.give_up_after;
        let body = plan.body(plan.amount);
        let racers = (0..plan.racers)
            .map(|racer| self.settle(plan, body.clone(), racer == 0 && plan.drop_first, deadline));
        let mut ids: Vec<String> = join_all(racers).await.into_iter().flatten().collect();
        for _ in 0..plan.retries {
            ids.extend(self.settle(plan, body.clone(), false, deadline).await);
        }
        // Only a key whose payment is recorded must refuse another body; a
        // payment given up on may have left the key free.
        if plan.altered && !ids.is_empty() {
            self.send_altered(plan, deadline).await;
        }
        ids
    }

    /// Sends the payment until it gets a 201 (first or replayed) and returns
    /// the charge id, retrying through 409s, timeouts and server errors.
    async fn settle(
        &self,
        plan: &Plan,
        body: Bytes,
        mut drop_first: bool,
        deadline: Instant,
    ) -> Option<String> {
        let mut backoff = Backoff::new();
        while Instant::now() < deadline {
            let timeout = if std::mem::take(&mut drop_first) {
                self.config.drop_after
            } else {
                self.config.timeout
            };
            let answer = match self.send(plan, body.clone(), timeout).await {
                Some(answer) => answer,
                None => {
                    backoff.wait(None).await;
                    continue;
                }
            };
            match answer.status {
                StatusCode::CREATED => {
                    if answer.replayed {
                        bump(&self.tally.replays);
                    } else {
                        bump(&self.tally.created);
                    }
                    match serde_json::from_slice::<Charge>(&answer.body) {
                        Ok(charge) => return Some(charge.id),
                        Err(e) => {
                            tracing::warn!(key = %plan.key, error = %e, "a 201 without a charge");
                            bump(&self.tally.errors);
                            return None;
                        }
                    }
                }
                StatusCode::CONFLICT => {
                    bump(&self.tally.in_progress);
                    backoff.wait(answer.retry_after).await;
                }
                status if status.is_server_error() => {
                    bump(&self.tally.errors);
                    backoff.wait(answer.retry_after).await;
                }
                status => {
                    // A 4xx for a valid body under its own key is a bug to
                    // report, not something a retry fixes.
                    tracing::warn!(key = %plan.key, %status, "unexpected answer to a payment");
                    bump(&self.tally.errors);
                    return None;
                }
            }
        }
        tracing::warn!(key = %plan.key, "gave up on a payment");
        bump(&self.tally.errors);
        None
    }

    /// Reuses the key with another amount; the answer must be 422.
    async fn send_altered(&self, plan: &Plan, deadline: Instant) {
        let body = plan.body(plan.amount + 1);
        let mut backoff = Backoff::new();
        while Instant::now() < deadline {
            let Some(answer) = self.send(plan, body.clone(), self.config.timeout).await else {
                backoff.wait(None).await;
                continue;
            };
            if answer.status == StatusCode::UNPROCESSABLE_ENTITY {
                bump(&self.tally.mismatches);
            } else {
                // A 201 here is a charge for the altered body: the ledger
                // check counts it as wrong or double.
                tracing::warn!(key = %plan.key, status = %answer.status,
                    "a reused key with another body was not refused");
                bump(&self.tally.errors);
            }
            return;
        }
    }

    /// One request; counts it, and returns its answer or `None` when it was
    /// dropped or failed.
    async fn send(&self, plan: &Plan, body: Bytes, timeout: Duration) -> Option<Answer> {
        bump(&self.tally.requests);
        match self.client.post_payment(&plan.key, body, timeout).await {
            Ok(answer) => {
                self.tally.latency(answer.latency);
                Some(answer)
            }
            Err(ClientError::TimedOut(_)) => {
                bump(&self.tally.dropped);
                None
            }
            Err(e) => {
                tracing::debug!(key = %plan.key, error = %e, "request failed");
                bump(&self.tally.errors);
                None
            }
        }
    }
}

/// Exponential backoff with jitter, from 2 ms up to 100 ms. It honours a
/// server's `Retry-After` only as a ceiling: whole seconds are far coarser
/// than a payment that takes milliseconds, and a storm is meant to press.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            next: Duration::from_millis(2),
        }
    }

    async fn wait(&mut self, retry_after: Option<Duration>) {
        let ceiling = retry_after
            .unwrap_or(Duration::MAX)
            .max(Duration::from_millis(1));
        let jitter = rand::rng().random_range(0.5..1.5);
        tokio::time::sleep(self.next.mul_f64(jitter).min(ceiling)).await;
        self.next = (self.next * 2).min(Duration::from_millis(100));
    }
}
