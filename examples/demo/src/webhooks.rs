//! `idem-demo webhooks`: the inbox pattern end to end.
//!
//! A fake provider signs `events` events the Standard Webhooks way and
//! delivers them, resending some (racing the first delivery, or after a
//! pause) and mixing in forged and stale deliveries. The receiver
//! (`idem-inbox`, axum) verifies each over its raw bytes, dedupes on
//! (source, event id), enqueues durably and answers 202. Workers claim the
//! jobs and run a handler that replies through a rate-limited outbound API:
//! it fails now and then (503, or 429 with `Retry-After`) and is retried
//! with backoff; a few "poison" events always fail and end in the dead
//! letters. The handler's effect is a row written in the same transaction
//! as the outcome idem records for the event.
//!
//! With `chaos` the worker runs as a child process, killed with SIGKILL
//! that many times and started again. At the end every event's effects are
//! counted from the database: one each, none repeated, none lost.
//!
//! The queue and the store live in a temporary SQLite directory by
//! default, or in a PostgreSQL database. Event ids carry a run id, so runs
//! over one database never meet.

use std::fmt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_inbox::queue::{JobId, JobState, PostgresQueue, Queue, QueueError, SqliteQueue};
use idem_inbox::verify::StandardWebhooks;
use idem_inbox::Receiver;
use rand::Rng;

use effects::EffectBook;
use provider::{deliver, plan, SECRET};

mod effects;
mod provider;
pub(crate) mod worker;

/// The source the demo's events come from.
const SOURCE: &str = "provider";

/// The queue lease and idem lease of the demo's workers: a killed worker's
/// jobs are claimed again this long after the kill.
pub const DEMO_LEASE: Duration = Duration::from_millis(1500);

/// Where the demo keeps its queue, idempotency records and effects.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InboxSpec {
    /// A directory holding `queue.db` (the jobs) and `effects.db` (idem's
    /// records and the effects table).
    Sqlite(PathBuf),
    /// A PostgreSQL database, by URL: tables `idem_inbox_jobs`, idem's
    /// records and `idem_demo_webhook_effects`.
    Postgres(String),
}

impl std::str::FromStr for InboxSpec {
    type Err = WebhooksError;

    fn from_str(spec: &str) -> Result<InboxSpec, WebhooksError> {
        if let Some(dir) = spec.strip_prefix("sqlite:") {
            let dir = dir.strip_prefix("//").unwrap_or(dir);
            if !dir.is_empty() {
                return Ok(InboxSpec::Sqlite(PathBuf::from(dir)));
            }
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            return Ok(InboxSpec::Postgres(spec.to_owned()));
        }
        Err(WebhooksError::Spec(spec.to_owned()))
    }
}

impl fmt::Display for InboxSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InboxSpec::Sqlite(dir) => write!(f, "sqlite:{}", dir.display()),
            InboxSpec::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

/// The URL with any password replaced, so it can be printed.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

impl InboxSpec {
    /// Opens (and creates, if needed) the job queue.
    pub(crate) async fn open_queue(&self) -> Result<Arc<dyn Queue>, WebhooksError> {
        Ok(match self {
            InboxSpec::Sqlite(dir) => {
                std::fs::create_dir_all(dir).map_err(WebhooksError::Io)?;
                Arc::new(SqliteQueue::open(dir.join("queue.db")).await?)
            }
            InboxSpec::Postgres(url) => {
                let queue = PostgresQueue::connect(url).await?;
                // Two processes may migrate at once; the second finds the
                // table made or fails on the catalog race, then succeeds.
                if queue.migrate().await.is_err() {
                    queue.migrate().await?;
                }
                Arc::new(queue)
            }
        })
    }
}

/// A webhooks demo that could not run (as opposed to one that ran and
/// found a repeated or lost effect, which its report shows).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhooksError {
    /// `--store` names nothing the demo can keep an inbox in.
    #[error("unknown inbox store {0:?}: use sqlite:DIR or postgres://HOST/DB")]
    Spec(String),
    /// The queue failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The idempotency store or the effects table failed.
    #[error("store: {0}")]
    Store(idem_core::store::StoreError),
    /// A socket, file or child process failed.
    #[error(transparent)]
    Io(std::io::Error),
}

/// How the demo runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WebhooksConfig {
    /// Distinct events the provider sends (default 500).
    pub events: usize,
    /// Deliveries in flight at once (default 32).
    pub senders: usize,
    /// Jobs a worker handles at once (default 8).
    pub concurrency: usize,
    /// Times the worker process is killed with SIGKILL (default 0: the
    /// worker runs in this process).
    pub chaos: usize,
    /// Seed of the provider's plan.
    pub seed: u64,
    /// How long to wait for every event to settle (default 120 s).
    pub give_up_after: Duration,
    /// The most times one event is delivered (default 3; at least 1).
    pub max_deliveries: usize,
    /// Whether about one event in 40 always fails and must end in the dead
    /// letters (default true).
    pub poison: bool,
    /// The mean wait between two kills under chaos (default 250 ms; each
    /// wait is drawn between half and one and a half times it).
    pub kill_every: Duration,
}

impl Default for WebhooksConfig {
    fn default() -> WebhooksConfig {
        WebhooksConfig {
            events: 500,
            senders: 32,
            concurrency: 8,
            chaos: 0,
            seed: rand::rng().random(),
            give_up_after: Duration::from_secs(120),
            max_deliveries: 3,
            poison: true,
            kill_every: Duration::from_millis(250),
        }
    }
}

/// What the demo counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WebhooksReport {
    /// Distinct events sent.
    pub events: u64,
    /// Genuine deliveries made (first sends and resends).
    pub deliveries: u64,
    /// Forged and stale deliveries sent, and how many were refused with 401.
    pub forged: u64,
    /// See [`forged`](WebhooksReport::forged).
    pub forged_rejected: u64,
    /// Deliveries that made a new job.
    pub enqueued: u64,
    /// Deliveries acknowledged as duplicates of a queued event.
    pub duplicate_deliveries: u64,
    /// Jobs completed.
    pub handled: u64,
    /// Effect rows made.
    pub effects: u64,
    /// Effect rows beyond the first for an event: must be 0.
    pub duplicated_effects: u64,
    /// Events that should have taken effect and did not: must be 0.
    pub lost: u64,
    /// Failed attempts that were retried.
    pub retried: u64,
    /// Jobs in the dead letters, and how many events were poison.
    pub dead_lettered: u64,
    /// See [`dead_lettered`](WebhooksReport::dead_lettered).
    pub poison: u64,
    /// Acknowledgement time of genuine deliveries.
    pub ack_p50: Duration,
    /// See [`ack_p50`](WebhooksReport::ack_p50).
    pub ack_p99: Duration,
    /// Times the worker was killed with SIGKILL.
    pub kills: u64,
    /// Where it ran.
    pub target: String,
}

impl WebhooksReport {
    /// No repeated effect, none lost, every forgery refused, every poison
    /// event (and nothing else) in the dead letters.
    pub fn passed(&self) -> bool {
        self.duplicated_effects == 0
            && self.lost == 0
            && self.forged_rejected == self.forged
            && self.enqueued == self.events
            && self.dead_lettered == self.poison
    }
}

impl fmt::Display for WebhooksReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
        writeln!(f, "webhooks over {}", self.target)?;
        let rows = [
            ("events sent", self.events.to_string()),
            ("deliveries", self.deliveries.to_string()),
            (
                "forged/stale rejected",
                format!("{} of {}", self.forged_rejected, self.forged),
            ),
            ("enqueued", self.enqueued.to_string()),
            (
                "duplicate deliveries",
                self.duplicate_deliveries.to_string(),
            ),
            ("handled", self.handled.to_string()),
            ("effects", self.effects.to_string()),
            ("duplicates", self.duplicated_effects.to_string()),
            ("lost", self.lost.to_string()),
            ("retried", self.retried.to_string()),
            (
                "dead-lettered",
                format!("{} ({} poison)", self.dead_lettered, self.poison),
            ),
            ("ack p50", ms(self.ack_p50)),
            ("ack p99", ms(self.ack_p99)),
            ("worker kills", self.kills.to_string()),
        ];
        for (name, value) in rows {
            writeln!(f, "  {name:<24} {value:>12}")?;
        }
        write!(
            f,
            "{}",
            if self.passed() {
                "PASS: every event took effect once"
            } else {
                "FAIL: an effect was repeated or lost, or a forgery got in"
            }
        )
    }
}

/// Runs the demo over `inbox`. `exe` is the `idem-demo` program, run as
/// `exe webhooks-worker` when `config.chaos` asks for a killable worker.
pub async fn run_webhooks(
    exe: PathBuf,
    inbox: &InboxSpec,
    config: &WebhooksConfig,
) -> Result<WebhooksReport, WebhooksError> {
    let run = format!(
        "{:x}{:04x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
        rand::rng().random::<u16>()
    );
    let queue = inbox.open_queue().await?;
    // The worker side migrates the same tables; doing it here first keeps
    // the child from racing the receiver on a fresh database.
    let book = EffectBook::open(inbox)
        .await
        .map_err(WebhooksError::Store)?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(WebhooksError::Io)?;
    let url = format!(
        "http://{}/",
        listener.local_addr().map_err(WebhooksError::Io)?
    );
    let receiver = Receiver::new(
        SOURCE,
        StandardWebhooks::new([SECRET]).expect("a valid secret"),
        Arc::clone(&queue),
    );
    let serving = tokio::spawn(async move { axum::serve(listener, receiver.router()).await });

    let mut worker = if config.chaos == 0 {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (inbox, concurrency) = (inbox.clone(), config.concurrency);
        let task = tokio::spawn(async move {
            worker::run_webhooks_worker(&inbox, concurrency, async {
                let _ = stopped.await;
            })
            .await
        });
        WorkerRun::InProcess(Some((stop, task)))
    } else {
        let mut child = ChildWorker {
            exe,
            inbox: match inbox {
                InboxSpec::Sqlite(dir) => format!("sqlite:{}", dir.display()),
                InboxSpec::Postgres(url) => url.clone(),
            },
            concurrency: config.concurrency,
            child: None,
        };
        child.spawn().map_err(WebhooksError::Io)?;
        WorkerRun::Child(child)
    };

    let planned = plan(
        &run,
        config.events,
        config.seed,
        config.max_deliveries.max(1),
        config.poison,
    );
    let delivering = {
        let (url, planned, senders, seed) =
            (url.clone(), planned.clone(), config.senders, config.seed);
        tokio::spawn(async move { deliver(&url, &planned, senders, seed).await })
    };
    let genuine: Vec<&str> = planned
        .iter()
        .filter(|(p, ..)| !p.poison)
        .map(|(p, ..)| p.id.as_str())
        .collect();
    let poison = planned.iter().filter(|(p, ..)| p.poison).count() as u64;

    // Chaos: kill the worker at random moments while work remains.
    let started = Instant::now();
    let mut kills = 0;
    if let WorkerRun::Child(child) = &mut worker {
        while kills < config.chaos && started.elapsed() < config.give_up_after {
            // The first kill comes early, so a small run meets one too.
            let mean = config.kill_every.as_millis().max(2) as u64;
            let pause = if kills == 0 {
                rand::rng().random_range(20..150)
            } else {
                rand::rng().random_range(mean / 2..mean * 3 / 2)
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let counts = book.counts(SOURCE).await.map_err(WebhooksError::Store)?;
            if delivering.is_finished() && genuine.iter().all(|id| counts.contains_key(*id)) {
                break;
            }
            child.kill().map_err(WebhooksError::Io)?;
            kills += 1;
            child.spawn().map_err(WebhooksError::Io)?;
        }
    }
    let sent = delivering
        .await
        .map_err(|e| WebhooksError::Io(std::io::Error::other(e)))?;

    // Wait until every genuine event took effect and every job settled.
    let jobs: Vec<(&str, JobId)> = planned
        .iter()
        .filter_map(|(p, ..)| sent.jobs.get(&p.id).map(|j| (p.id.as_str(), JobId::new(j))))
        .collect();
    loop {
        let counts = book.counts(SOURCE).await.map_err(WebhooksError::Store)?;
        let effects_in = genuine.iter().all(|id| counts.contains_key(*id));
        let mut settled = effects_in;
        if settled {
            for (_, job) in &jobs {
                let state = queue.inspect(job).await?.map(|info| info.state);
                if !matches!(state, Some(JobState::Done | JobState::Dead)) {
                    settled = false;
                    break;
                }
            }
        }
        if settled || started.elapsed() > config.give_up_after {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.stop().await;
    serving.abort();

    let counts = book.counts(SOURCE).await.map_err(WebhooksError::Store)?;
    let mut report = WebhooksReport {
        events: config.events as u64,
        deliveries: sent.deliveries,
        forged: sent.forged,
        forged_rejected: sent.forged_rejected,
        enqueued: sent.enqueued,
        duplicate_deliveries: sent.duplicates,
        poison,
        kills: kills as u64,
        target: format!("{inbox} (run {run}, seed {})", config.seed),
        ..WebhooksReport::default()
    };
    for (_, job) in &jobs {
        let Some(info) = queue.inspect(job).await? else {
            continue;
        };
        let failures = info.history.len() as u64;
        match info.state {
            JobState::Done => {
                report.handled += 1;
                report.retried += failures;
            }
            JobState::Dead => {
                report.dead_lettered += 1;
                report.retried += failures.saturating_sub(1);
            }
            _ => report.retried += failures,
        }
    }
    for id in &genuine {
        match counts.get(*id).copied().unwrap_or(0) {
            0 => report.lost += 1,
            n => {
                report.effects += n;
                report.duplicated_effects += n - 1;
            }
        }
    }
    // An effect for a poison event would be a handler bug: count it too.
    report.effects += planned
        .iter()
        .filter(|(p, ..)| p.poison)
        .map(|(p, ..)| counts.get(&p.id).copied().unwrap_or(0))
        .sum::<u64>();
    let mut acks = sent.acks;
    acks.sort();
    report.ack_p50 = percentile(&acks, 50);
    report.ack_p99 = percentile(&acks, 99);
    Ok(report)
}

/// Nearest rank.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// An in-process worker: what stops it, and its task.
type InProcessWorker = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), WebhooksError>>,
);

enum WorkerRun {
    InProcess(Option<InProcessWorker>),
    Child(ChildWorker),
}

impl WorkerRun {
    async fn stop(&mut self) {
        match self {
            WorkerRun::InProcess(run) => {
                if let Some((stop, task)) = run.take() {
                    let _ = stop.send(());
                    match task.await {
                        Ok(Err(e)) => tracing::warn!(error = %e, "the worker failed"),
                        Err(e) => tracing::warn!(error = %e, "the worker panicked"),
                        Ok(Ok(())) => {}
                    }
                }
            }
            WorkerRun::Child(child) => {
                let _ = child.kill();
            }
        }
    }
}

/// The worker as a child process: `exe webhooks-worker --inbox SPEC`.
struct ChildWorker {
    exe: PathBuf,
    inbox: String,
    concurrency: usize,
    child: Option<Child>,
}

impl ChildWorker {
    fn spawn(&mut self) -> std::io::Result<()> {
        let child = Command::new(&self.exe)
            .args(["webhooks-worker", "--inbox", &self.inbox])
            .arg("--concurrency")
            .arg(self.concurrency.to_string())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL: no shutdown, jobs in flight cut off where they stand.
    fn kill(&mut self) -> std::io::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}
