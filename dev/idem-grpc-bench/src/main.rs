//! Calls per second through idem-tonic's server layer against a bare tonic
//! handler, in the same run, on the same Redis.
//!
//! `cargo run --release -p idem-grpc-bench -- --help`; `--rows` and
//! `--calls` make a run of a fixed size for instruction counts.
//!
//! Two servers on 127.0.0.1 serve the same handler, which does one Redis
//! `GET` (its work) and answers a small message: `control` bare, `idem`
//! behind `IdempotencyLayer` on a `RedisStore` over the same server. The
//! same client code loads each from `--concurrency` tasks over
//! `--connections` HTTP/2 connections for `--duration`:
//!
//! * `control`: the bare handler, one Redis round trip a call;
//! * `first`: `idem` with a new key every call: claim, the handler's `GET`,
//!   record (three round trips);
//! * `replay`: `idem` with keys recorded beforehand: one round trip, the
//!   handler does not run.
//!
//! Each repetition runs the three in a rotated order; the figures are the
//! medians over repetitions, and the ratios are idem ÷ control.
//!
//! `--work-ms 0,10` measures each handler in turn; `--markdown FILE`
//! writes a row per handler between the file's `grpc` markers, keeping the
//! rows of handlers this run did not measure.
#![forbid(unsafe_code)]

// idem-bench's writer, compiled here as a module: a dependency on
// idem-bench would build every bench's HTTP stack into this binary.
#[allow(unreachable_pub, dead_code)]
#[path = "../../idem-bench/src/markdown.rs"]
mod markdown;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idem_core::Idempotent;
use idem_redis::RedisStore;
use idem_tonic::IdempotencyLayer;
use idem_tonic_testing::proto::payments_server::Payments;
use idem_tonic_testing::{
    incoming, listener, ChargeReply, ChargeRequest, PaymentsClient, PaymentsServer, CHARGE,
};
use redis::aio::ConnectionManager;
use tonic::codegen::tokio_stream;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// idem-tonic against a bare tonic handler doing one Redis GET.
#[derive(Debug, Parser)]
struct Args {
    /// The Redis server.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Repetitions; the figures are their medians.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// How long each row of a repetition runs.
    #[arg(long, default_value = "2", value_parser = seconds)]
    duration: Duration,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// HTTP/2 connections the calls share.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Keys recorded before the replay rows.
    #[arg(long, default_value_t = 1000)]
    replay_keys: usize,
    /// Each row makes this many calls instead of running for `--duration`:
    /// for instruction counts under `valgrind --tool=callgrind`, where a
    /// fixed duration would make a fixed count meaningless.
    #[arg(long)]
    calls: Option<u64>,
    /// The rows to run, comma-separated (`control,first,replay`).
    #[arg(long, value_delimiter = ',', default_value = "control,first,replay", value_parser = row)]
    rows: Vec<Row>,
    /// Milliseconds the handler also waits after its `GET`, standing for a
    /// service that waits on its database or a payment network (0: the
    /// `GET` is all its work); a list measures each in turn.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    work_ms: Vec<u64>,
    /// Writes the handlers' rows between the `grpc` markers of this
    /// Markdown file (`BENCHMARKS.md`).
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

fn row(text: &str) -> Result<Row, String> {
    [Row::Control, Row::First, Row::Replay]
        .into_iter()
        .find(|row| row.name() == text)
        .ok_or_else(|| format!("no row {text}: control, first or replay"))
}

fn seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|secs| *secs > 0.0 && secs.is_finite())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("not a number of seconds: {text}"))
}

/// The handler: one Redis `GET` and `wait`, then a small answer.
#[derive(Clone)]
struct Handler {
    redis: ConnectionManager,
    key: String,
    wait: Duration,
}

#[tonic::async_trait]
impl Payments for Handler {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        let mut redis = self.redis.clone();
        let got: redis::RedisResult<Option<Vec<u8>>> = redis::cmd("GET")
            .arg(&self.key)
            .query_async(&mut redis)
            .await;
        if let Err(error) = got {
            return Err(Status::unavailable(error.to_string()));
        }
        if !self.wait.is_zero() {
            tokio::time::sleep(self.wait).await;
        }
        let request = request.into_inner();
        Ok(Response::new(ChargeReply {
            charge_id: "ch_0123456789abcdef0123456789abcdef".into(),
            amount: request.amount,
            run: 1,
        }))
    }

    type WatchStream = tokio_stream::Empty<Result<ChargeReply, Status>>;

    async fn watch(
        &self,
        _: Request<ChargeRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not measured"))
    }
}

async fn serve(layer: Option<IdempotencyLayer>, handler: Handler) -> SocketAddr {
    let (listener, address) = listener().await;
    let service = PaymentsServer::new(handler);
    tokio::spawn(async move {
        let served = match layer {
            Some(layer) => {
                Server::builder()
                    .layer(layer)
                    .add_service(service)
                    .serve_with_incoming(incoming(listener))
                    .await
            }
            None => {
                Server::builder()
                    .add_service(service)
                    .serve_with_incoming(incoming(listener))
                    .await
            }
        };
        if let Err(error) = served {
            eprintln!("grpc-bench: a server stopped: {error}");
        }
    });
    address
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    Control,
    First,
    Replay,
}

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::Control => "control",
            Row::First => "first",
            Row::Replay => "replay",
        }
    }
}

async fn channels(address: SocketAddr, count: usize) -> Result<Vec<Channel>, BoxError> {
    let mut channels = Vec::new();
    for _ in 0..count.max(1) {
        channels.push(
            Channel::from_shared(format!("http://{address}"))?
                .connect()
                .await?,
        );
    }
    Ok(channels)
}

fn request(key: Option<String>) -> Request<ChargeRequest> {
    let mut request = Request::new(ChargeRequest {
        request_id: String::new(),
        amount: 1250,
        currency: "EUR".into(),
        outcome: String::new(),
    });
    if let Some(key) = key {
        let value = key.parse().expect("an ASCII key");
        request.metadata_mut().insert("idempotency-key", value);
    }
    request
}

/// Loads `channels` from `concurrency` tasks for `duration`; calls a
/// second.
async fn load(row: Row, channels: &[Channel], args: &Args, rep: usize) -> Result<f64, BoxError> {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + args.duration;
    // With a call count, the tasks take calls from one counter.
    let budget = Arc::new(AtomicU64::new(args.calls.unwrap_or(u64::MAX)));
    let counted = args.calls.is_some();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..args.concurrency {
        let budget = Arc::clone(&budget);
        let mut client = PaymentsClient::new(channels[task % channels.len()].clone());
        let done = Arc::clone(&done);
        let failed = Arc::clone(&failed);
        let replay_keys = args.replay_keys.max(1);
        tasks.spawn(async move {
            let mut n = 0usize;
            loop {
                if counted {
                    let taken = budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                        left.checked_sub(1)
                    });
                    if taken.is_err() {
                        break;
                    }
                } else if Instant::now() >= deadline {
                    break;
                }
                let key = match row {
                    Row::Control => None,
                    Row::First => Some(format!("first-{rep}-{task}-{n}")),
                    Row::Replay => Some(format!("replay-{}", (task * 7919 + n) % replay_keys)),
                };
                match client.charge(request(key)).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                n += 1;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        return Err(format!("{failed} calls failed in the {} row", row.name()).into());
    }
    Ok(done.load(Ordering::Relaxed) as f64 / elapsed)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() % 2 {
        1 => values[mid],
        _ => (values[mid - 1] + values[mid]) / 2.0,
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let redis = ConnectionManager::new(redis::Client::open(args.redis.as_str())?).await?;
    let run = format!("idem-grpc-bench:{}:", std::process::id());
    let mut table = markdown::Table::new(&["handler", ">bare calls/s", ">first", ">replay"]);
    let mut measured = Ok(());
    for &work_ms in &args.work_ms {
        // Keys of this handler only: another's records would replay.
        match measure(&args, &redis, &format!("{run}{work_ms}:"), work_ms).await {
            Ok(medians) => table.row(card_row(work_ms, &medians)),
            Err(error) => {
                measured = Err(error);
                break;
            }
        }
    }
    remove_keys(&redis, &run).await?;
    measured?;
    if let Some(path) = &args.markdown {
        markdown::rewrite_rows(path, "grpc", &table, 1)?;
    }
    Ok(())
}

/// The card's row for a handler waiting `work_ms`: bare calls a second,
/// then first and replay with their ratios to it.
fn card_row(work_ms: u64, medians: &[(Row, f64)]) -> Vec<String> {
    let rate = |wanted: Row| {
        medians
            .iter()
            .find(|(row, _)| *row == wanted)
            .map(|(_, rate)| *rate)
    };
    let control = rate(Row::Control);
    let against = |row: Row| match (rate(row), control) {
        (Some(rate), Some(control)) => {
            format!("{} ({:.2}×)", markdown::thousands(rate), rate / control)
        }
        (Some(rate), None) => markdown::thousands(rate),
        (None, _) => "-".to_owned(),
    };
    vec![
        match work_ms {
            0 => "one `GET`".to_owned(),
            ms => format!("one `GET` + {ms} ms"),
        },
        control.map_or("-".to_owned(), markdown::thousands),
        against(Row::First),
        against(Row::Replay),
    ]
}

/// One handler's run: the rows in rotated order, `--reps` times; prints
/// and returns each row's median calls a second.
async fn measure(
    args: &Args,
    redis: &ConnectionManager,
    tag: &str,
    work_ms: u64,
) -> Result<Vec<(Row, f64)>, BoxError> {
    let handler = Handler {
        redis: redis.clone(),
        key: format!("{tag}work"),
        wait: Duration::from_millis(work_ms),
    };
    let store = RedisStore::from_connection(redis.clone()).with_prefix(tag.to_owned());
    let idem = Idempotent::new(store).with_namespace(idem_tonic::NAMESPACE);
    let layer = IdempotencyLayer::from_idempotent(idem).unary(CHARGE);
    let control = channels(serve(None, handler.clone()).await, args.connections).await?;
    let idem = channels(serve(Some(layer), handler).await, args.connections).await?;

    // The keys the replay rows replay.
    for key in 0..args.replay_keys.max(1) {
        let mut client = PaymentsClient::new(idem[0].clone());
        client
            .charge(request(Some(format!("replay-{key}"))))
            .await?;
    }

    let rows = args.rows.clone();
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for rep in 0..args.reps.max(1) {
        for turn in 0..rows.len() {
            let at = (turn + rep) % rows.len();
            let row = rows[at];
            let channels = match row {
                Row::Control => &control,
                _ => &idem,
            };
            let rate = load(row, channels, args, rep).await?;
            eprintln!(
                "grpc-bench: rep {rep} {:<8} {rate:>10.0} calls/s",
                row.name()
            );
            figures[at].push(rate);
        }
    }

    println!(
        "grpc-redis c{} over {} connections, handler work {} ms, {} reps of {:?}, medians:",
        args.concurrency, args.connections, work_ms, args.reps, args.duration
    );
    let medians: Vec<(Row, f64)> = rows
        .iter()
        .zip(&figures)
        .map(|(row, values)| (*row, median(&mut values.clone())))
        .collect();
    let control = medians
        .iter()
        .find(|(row, _)| *row == Row::Control)
        .map(|(_, rate)| *rate);
    for (row, rate) in &medians {
        match control {
            Some(control) => println!(
                "  {:<8} {rate:>10.0} calls/s  {:.2}x control",
                row.name(),
                rate / control
            ),
            None => println!("  {:<8} {rate:>10.0} calls/s", row.name()),
        }
    }
    Ok(medians)
}

/// Removes the run's keys: its records and the handlers' keys.
async fn remove_keys(redis: &ConnectionManager, run: &str) -> Result<(), BoxError> {
    let mut admin = redis.clone();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{run}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut admin)
            .await?;
        if !keys.is_empty() {
            let _: () = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut admin)
                .await?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    Ok(())
}
