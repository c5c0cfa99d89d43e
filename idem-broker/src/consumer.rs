//! The consumer loop, written once for every broker: take a delivery, run
//! its handler under idem's `execute`, and settle the delivery only after
//! the outcome is recorded.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::backoff::Backoff;
use idem_core::store::State;
use idem_core::{Error as IdemError, Idempotent};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::delivery::{Delivery, Source};
use crate::handler::{Handler, HandlerError, Message};
use crate::BrokerError;

/// Derives a message's idempotency key from its delivery; `None` sends the
/// message to the dead letters (it cannot be made idempotent).
pub type KeyFn = Arc<dyn Fn(&dyn Delivery) -> Option<String> + Send + Sync>;

/// How a consumer runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// Handlers run at once (default 8).
    pub concurrency: usize,
    /// Deliveries of one message before it goes to the dead letters
    /// (default 8). A message delivered more often than this — it keeps
    /// killing its consumer — is parked without running again, unless its
    /// key is held by another consumer's live idem lease (it is handed
    /// back until that consumer is done) or its outcome is recorded (it
    /// is replayed and acked): the store is read once to tell, for such
    /// deliveries only.
    pub max_deliveries: u32,
    /// The wait before a failed message is delivered again, where the
    /// broker can delay a redelivery (idem-inbox's policy).
    pub backoff: Backoff,
    /// How long one wait for a delivery lasts before the loop looks at
    /// shutdown again (default 200 ms).
    pub poll: Duration,
    /// On shutdown, how long running handlers may finish (default 30 s);
    /// those still running then are dropped unacked, and the broker
    /// redelivers them.
    pub grace: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> ConsumerConfig {
        ConsumerConfig {
            concurrency: 8,
            max_deliveries: 8,
            // The first redelivery within 2 s, doubling up to 5 min.
            backoff: Backoff::new(Duration::from_secs(2), Duration::from_secs(300)),
            poll: Duration::from_millis(200),
            grace: Duration::from_secs(30),
        }
    }
}

impl ConsumerConfig {
    /// Sets [`concurrency`](ConsumerConfig::concurrency) (at least 1).
    pub fn with_concurrency(mut self, n: usize) -> ConsumerConfig {
        self.concurrency = n.max(1);
        self
    }

    /// Sets [`max_deliveries`](ConsumerConfig::max_deliveries) (at least 1).
    pub fn with_max_deliveries(mut self, n: u32) -> ConsumerConfig {
        self.max_deliveries = n.max(1);
        self
    }

    /// Sets [`backoff`](ConsumerConfig::backoff).
    pub fn with_backoff(mut self, backoff: Backoff) -> ConsumerConfig {
        self.backoff = backoff;
        self
    }

    /// Sets [`poll`](ConsumerConfig::poll).
    pub fn with_poll(mut self, poll: Duration) -> ConsumerConfig {
        self.poll = poll;
        self
    }

    /// Sets [`grace`](ConsumerConfig::grace).
    pub fn with_grace(mut self, grace: Duration) -> ConsumerConfig {
        self.grace = grace;
        self
    }
}

/// How one delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler ran and succeeded; its outcome is recorded and the
    /// delivery acked.
    Handled,
    /// A recorded success was replayed (a redelivery, a duplicate
    /// publish); the delivery was acked without running the handler.
    Replayed,
    /// The handler failed, or another consumer holds the key, or the store
    /// failed: the message was handed back for a later delivery.
    Retried,
    /// The message went to the dead letters.
    DeadLettered,
    /// Nothing was settled: the delivery is left to the broker's
    /// redelivery (this consumer lost its idem lease, or the broker failed
    /// while settling).
    Abandoned,
}

impl Outcome {
    /// The outcome's name, as the `outcome` label of the
    /// `idem_broker_deliveries_total` counter: `handled`, `replayed`,
    /// `retried`, `dead_lettered` or `abandoned`.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Handled => "handled",
            Outcome::Replayed => "replayed",
            Outcome::Retried => "retried",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Abandoned => "abandoned",
        }
    }
}

/// Counts of what a consumer did, by [`Outcome`]. The same counts go to
/// the `metrics` facade as `idem_broker_deliveries_total{store, namespace,
/// outcome}` (never labelled by message id), for whatever exporter the
/// application installs.
#[derive(Debug, Default)]
pub struct Stats {
    handled: AtomicU64,
    replayed: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    abandoned: AtomicU64,
}

impl Stats {
    fn count(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Handled => &self.handled,
            Outcome::Replayed => &self.replayed,
            Outcome::Retried => &self.retried,
            Outcome::DeadLettered => &self.dead_lettered,
            Outcome::Abandoned => &self.abandoned,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// How many deliveries ended with `outcome`.
    pub fn of(&self, outcome: Outcome) -> u64 {
        match outcome {
            Outcome::Handled => &self.handled,
            Outcome::Replayed => &self.replayed,
            Outcome::Retried => &self.retried,
            Outcome::DeadLettered => &self.dead_lettered,
            Outcome::Abandoned => &self.abandoned,
        }
        .load(Ordering::Relaxed)
    }
}

/// Runs a [`Handler`] on every message a [`Source`] delivers, under idem's
/// `execute` keyed by the message's id.
///
/// For each delivery, in this order:
///
/// 1. The key is the message id (or what [`with_key`](Consumer::with_key)
///    derives); a message without one, or delivered more than
///    [`max_deliveries`](ConsumerConfig::max_deliveries) times while no
///    consumer holds its key and no outcome is recorded, goes to the dead
///    letters unrun.
/// 2. The handler runs under `execute`, with the SHA-256 of the payload as
///    the request: a second message under the same id with another body is
///    a mismatch and goes to the dead letters. While it runs, idem renews
///    its own lease and the consumer keeps the delivery alive
///    ([`Delivery::in_progress`]) at the source's heartbeat.
/// 3. `Ok` is recorded, **then** the delivery is acked. A delivery whose
///    key already has a recorded success is acked without running.
/// 4. A retryable error is handed back after the backoff (or the error's
///    `Retry-After`); a permanent one, or one on the last allowed
///    delivery, goes to the dead letters.
/// 5. A key held by another consumer's live lease is handed back after the
///    time left on that lease. A consumer that lost its lease while its
///    handler ran (it stalled past the lease, and another took the key
///    over) settles nothing: its late ack could settle the other
///    consumer's delivery of the same message.
#[derive(Clone)]
pub struct Consumer {
    idem: Idempotent,
    config: ConsumerConfig,
    key: KeyFn,
    stats: Arc<Stats>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("config", &self.config)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer recording outcomes through `idem`, keyed by message id.
    pub fn new(idem: Idempotent) -> Consumer {
        Consumer {
            idem,
            config: ConsumerConfig::default(),
            key: Arc::new(|delivery: &dyn Delivery| delivery.message_id().map(str::to_owned)),
            stats: Arc::default(),
        }
    }

    /// Runs with `config`.
    pub fn with_config(mut self, config: ConsumerConfig) -> Consumer {
        self.config = config;
        self
    }

    /// Derives each message's key with `key` instead of taking its message
    /// id (a field of the payload, say).
    pub fn with_key(
        mut self,
        key: impl Fn(&dyn Delivery) -> Option<String> + Send + Sync + 'static,
    ) -> Consumer {
        self.key = Arc::new(key);
        self
    }

    /// What this consumer (and its clones) did so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Takes deliveries from `source` and handles each until `shutdown`
    /// completes; then takes no more, lets running handlers finish within
    /// the grace period, and returns. A broker failure while waiting for a
    /// delivery ends the loop with that error (after the same grace).
    pub async fn run<S, H>(
        &self,
        mut source: S,
        handler: H,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), BrokerError>
    where
        S: Source,
        H: Handler,
    {
        let handler: Arc<dyn Handler> = Arc::new(handler);
        let slots = Arc::new(Semaphore::new(self.config.concurrency));
        let heartbeat = source.heartbeat();
        let mut running = JoinSet::new();
        tokio::pin!(shutdown);
        let result = loop {
            let slot = tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break Ok(()),
                },
            };
            let next = tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                next = source.next(self.config.poll) => next,
            };
            // Finished handlers are reaped as we go, so the set stays small.
            while running.try_join_next().is_some() {}
            match next {
                Ok(Some(delivery)) => {
                    let this = self.clone();
                    let handler = handler.clone();
                    running.spawn(async move {
                        let _slot = slot;
                        this.handle(delivery, &*handler, heartbeat).await;
                    });
                }
                Ok(None) => {}
                Err(error) => break Err(error),
            }
        };
        let drained = tokio::time::timeout(self.config.grace, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                left = running.len(),
                "handlers still running after the grace period are dropped unacked; the broker redelivers them"
            );
            running.shutdown().await;
        }
        result
    }

    /// Handles one delivery to the end and says how it ended.
    pub async fn handle(
        &self,
        delivery: Box<dyn Delivery>,
        handler: &dyn Handler,
        heartbeat: Option<Duration>,
    ) -> Outcome {
        let outcome = self.decide(&*delivery, handler, heartbeat).await;
        self.stats.count(outcome);
        metrics::counter!(
            "idem_broker_deliveries_total",
            "store" => self.idem.store_name().to_owned(),
            "namespace" => self.idem.namespace().to_owned(),
            "outcome" => outcome.name(),
        )
        .increment(1);
        outcome
    }

    async fn decide(
        &self,
        delivery: &dyn Delivery,
        handler: &dyn Handler,
        heartbeat: Option<Duration>,
    ) -> Outcome {
        let count = delivery.delivery_count();
        let Some(key) = (self.key)(delivery) else {
            return self
                .dead_letter(delivery, "the message has no id to key it by")
                .await;
        };
        if count > self.config.max_deliveries {
            match self.standing(&key).await {
                // Another consumer is handling the message under a live
                // lease (a duplicate publish, or a redelivery that overtook
                // a slow handler): these deliveries were handed back while
                // it worked, not failures of their own. Wait for it.
                Standing::Held(left) => return self.retry(delivery, left).await,
                // Handled already: `execute` below replays it, and the
                // delivery is acked.
                Standing::Recorded => {}
                Standing::Unheld => {
                    let reason = format!(
                        "delivered {count} times, more than the {} allowed",
                        self.config.max_deliveries
                    );
                    return self.dead_letter(delivery, &reason).await;
                }
            }
        }
        let request = hex::encode(Sha256::digest(delivery.payload()));
        let message = Message {
            key: key.clone(),
            payload: delivery.payload().to_vec(),
            delivery: count,
        };
        let ran = AtomicBool::new(false);
        let result: Result<(), IdemError<HandlerError>> = self
            .idem
            .execute(&key, &request, || async {
                ran.store(true, Ordering::Relaxed);
                run_with_heartbeat(handler.handle(&message), delivery, heartbeat).await
            })
            .await;
        match result {
            Ok(()) => match delivery.ack().await {
                Ok(()) if ran.load(Ordering::Relaxed) => Outcome::Handled,
                Ok(()) => Outcome::Replayed,
                Err(error) => {
                    // The outcome is recorded: the redelivery replays it.
                    tracing::warn!(%key, %error, "ack failed after the outcome was recorded");
                    Outcome::Abandoned
                }
            },
            Err(IdemError::Work(error)) if error.is_permanent() => {
                self.dead_letter(delivery, error.message()).await
            }
            Err(IdemError::Work(error)) if count >= self.config.max_deliveries => {
                let reason = format!(
                    "failed on delivery {count} of {}: {error}",
                    self.config.max_deliveries
                );
                self.dead_letter(delivery, &reason).await
            }
            Err(IdemError::Work(error)) => {
                let delay = error
                    .retry_after()
                    .unwrap_or_else(|| self.config.backoff.delay(count));
                self.retry(delivery, delay).await
            }
            Err(IdemError::InProgress { retry_after }) => self.retry(delivery, retry_after).await,
            Err(IdemError::LeaseLost) => {
                // Another consumer took the key over while this one stalled;
                // it settles its own delivery. An ack here could settle that
                // delivery before its outcome is recorded.
                tracing::warn!(%key, locator = %delivery.locator(),
                    "lost the idem lease while handling; leaving the delivery to the broker");
                Outcome::Abandoned
            }
            Err(IdemError::Mismatch) => {
                self.dead_letter(
                    delivery,
                    "another message was already handled under this id with a different payload",
                )
                .await
            }
            Err(IdemError::Store { source, when }) => {
                tracing::warn!(%key, error = %source, ?when, "idem store failed; the message is handed back");
                self.retry(delivery, self.config.backoff.delay(count)).await
            }
            Err(other) => self.dead_letter(delivery, &other.to_string()).await,
        }
    }

    /// Where the message's key stands in the idem store: one read, made
    /// only for a delivery past the limit. A store failure reads as
    /// unheld: the limit applies.
    async fn standing(&self, key: &str) -> Standing {
        let Ok(key) = self.idem.key(key) else {
            return Standing::Unheld;
        };
        match self.idem.store().load(key.as_str()).await {
            Ok(Some(record)) if record.state == State::Completed => Standing::Recorded,
            Ok(Some(record)) if record.state == State::InFlight && !record.lease_lapsed() => {
                Standing::Held(record.lease_remaining.unwrap_or_default())
            }
            Ok(_) => Standing::Unheld,
            Err(error) => {
                tracing::warn!(error = %error, "idem store failed while checking a message past its delivery limit");
                Standing::Unheld
            }
        }
    }

    async fn retry(&self, delivery: &dyn Delivery, delay: Duration) -> Outcome {
        match delivery.retry(delay).await {
            Ok(()) => Outcome::Retried,
            Err(error) => {
                tracing::warn!(locator = %delivery.locator(), %error, "could not hand the message back");
                Outcome::Abandoned
            }
        }
    }

    async fn dead_letter(&self, delivery: &dyn Delivery, reason: &str) -> Outcome {
        match delivery.dead_letter(reason).await {
            Ok(()) => Outcome::DeadLettered,
            Err(error) => {
                tracing::warn!(locator = %delivery.locator(), %error, "could not dead-letter the message");
                Outcome::Abandoned
            }
        }
    }
}

/// Where a message past its delivery limit stands.
enum Standing {
    /// Another consumer holds its key, for this much longer.
    Held(Duration),
    /// Its outcome is recorded.
    Recorded,
    /// Nobody holds it and nothing is recorded: the limit applies.
    Unheld,
}

/// Runs `work`, telling the broker every `heartbeat` that the delivery is
/// still being handled. The heartbeat runs in the same task: nothing is
/// spawned, so nothing outlives the work.
async fn run_with_heartbeat<F: Future>(
    work: F,
    delivery: &dyn Delivery,
    heartbeat: Option<Duration>,
) -> F::Output {
    let Some(every) = heartbeat.filter(|d| !d.is_zero()) else {
        return work.await;
    };
    tokio::pin!(work);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            output = &mut work => return output,
            _ = ticks.tick() => {
                if let Err(error) = delivery.in_progress().await {
                    tracing::warn!(locator = %delivery.locator(), %error, "could not keep the delivery alive");
                }
            }
        }
    }
}
