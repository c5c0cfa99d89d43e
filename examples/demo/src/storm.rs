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
use http::{header, StatusCode};
use idem_client::{AttemptOutcome, IdemClient, RetryPolicy};
use idem_core::store::Store;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::client::{ClientError, PaymentsClient};
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
    /// The HTTP client that pays could not be built.
    #[error("could not build the HTTP client: {0}")]
    Client(#[source] idem_client::reqwest::Error),
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
    /// Pays, and retries each payment under its one key.
    payments: IdemClient,
    payments_url: String,
    config: StormConfig,
    tally: Arc<Tally>,
}

/// Fires a retry storm at the payments API at `url` and checks the ledger
/// it leaves: every intended payment must be charged exactly once.
///
/// The storm's keys are unique to this run, so a server that has served
/// other traffic can be stormed again; only charges under this run's keys
/// are counted.
pub async fn run_storm(url: &str, config: &StormConfig) -> Result<Report, StormError> {
    let started = Instant::now();
    let tally = Arc::new(Tally::default());
    let storm = Arc::new(Storm {
        client: PaymentsClient::new(url, config.clients * 4),
        payments: payments_client(config, Arc::clone(&tally)).map_err(StormError::Client)?,
        payments_url: format!("{}/payments", url.trim_end_matches('/')),
        config: config.clone(),
        tally,
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
    /// the charge id; `idem-client` retries it through 409s, timeouts,
    /// dropped connections and server errors under the plan's one key.
    async fn settle(
        &self,
        plan: &Plan,
        body: Bytes,
        drop_first: bool,
        deadline: Instant,
    ) -> Option<String> {
        let mut answer = None;
        if drop_first {
            // One attempt that hangs up mid-handler; a fast answer still counts.
            let once = RetryPolicy::never().with_attempt_timeout(self.config.drop_after);
            answer = self.pay_once(plan, body.clone(), once).await.ok();
        }
        let answer = match answer {
            Some(answer) if answer.status() == StatusCode::CREATED => Ok(answer),
            _ => {
                let left = deadline.saturating_duration_since(Instant::now());
                let policy = self.retry_policy().with_max_elapsed(left);
                self.pay_once(plan, body, policy).await
            }
        };
        match answer {
            Ok(answer) if answer.status() == StatusCode::CREATED => {
                if answer.replayed() {
                    bump(&self.tally.replays);
                } else {
                    bump(&self.tally.created);
                }
                match answer.json::<Charge>() {
                    Ok(charge) => Some(charge.id),
                    Err(e) => {
                        tracing::warn!(key = %plan.key, error = %e, "a 201 without a charge");
                        bump(&self.tally.errors);
                        None
                    }
                }
            }
            Ok(answer) => {
                // A 4xx for a valid body under its own key is a bug to
                // report, not something a retry fixes.
                tracing::warn!(key = %plan.key, status = %answer.status(), "unexpected answer to a payment");
                bump(&self.tally.errors);
                None
            }
            Err(e) => {
                tracing::warn!(key = %plan.key, error = %e, "gave up on a payment");
                bump(&self.tally.errors);
                None
            }
        }
    }

    /// Reuses the key with another amount; the answer must be 422.
    async fn send_altered(&self, plan: &Plan, deadline: Instant) {
        let body = plan.body(plan.amount + 1);
        let left = deadline.saturating_duration_since(Instant::now());
        match self
            .pay_once(plan, body, self.retry_policy().with_max_elapsed(left))
            .await
        {
            Err(idem_client::Error::KeyReused { .. }) => bump(&self.tally.mismatches),
            // A 201 here is a charge for the altered body: the ledger check
            // counts it as wrong or double.
            answer => {
                let status = answer.as_ref().map(|a| a.status().to_string());
                tracing::warn!(key = %plan.key, ?status,
                    "a reused key with another body was not refused");
                bump(&self.tally.errors);
            }
        }
    }

    /// One logical request under the plan's key, retried as `policy` says.
    async fn pay_once(
        &self,
        plan: &Plan,
        body: Bytes,
        policy: RetryPolicy,
    ) -> Result<idem_client::Response, idem_client::Error> {
        self.payments
            .post(&self.payments_url)
            .key(&plan.key)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .retry(policy)
            .send()
            .await
    }

    /// Retries until the payment's deadline, backing off from 2 ms up to
    /// 100 ms. The server's `Retry-After` is honoured only up to 5 ms: its
    /// whole seconds are far coarser than a payment that takes
    /// milliseconds, and a storm is meant to press.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::default()
            .with_max_attempts(u32::MAX)
            .with_backoff(Duration::from_millis(2), Duration::from_millis(100))
            .with_retry_after_cap(Duration::from_millis(5))
            .with_attempt_timeout(self.config.timeout)
    }
}

/// The client that pays: every attempt it makes is counted in `tally`.
fn payments_client(
    config: &StormConfig,
    tally: Arc<Tally>,
) -> Result<IdemClient, idem_client::reqwest::Error> {
    let http = idem_client::reqwest::Client::builder()
        .pool_max_idle_per_host(config.clients * 4)
        .tcp_nodelay(true)
        .build()?;
    Ok(IdemClient::from_reqwest(http).with_observer(move |attempt| {
        bump(&tally.requests);
        match attempt.outcome {
            AttemptOutcome::Status(status) => {
                tally.latency(attempt.latency);
                if status == StatusCode::CONFLICT {
                    bump(&tally.in_progress);
                } else if status.is_server_error() {
                    bump(&tally.errors);
                }
            }
            AttemptOutcome::TimedOut => bump(&tally.dropped),
            _ => {
                tracing::debug!(key = ?attempt.key, outcome = ?attempt.outcome, "request failed");
                bump(&tally.errors);
            }
        }
    }))
}
