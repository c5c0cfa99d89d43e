//! `stream-bench`: responses recorded in chunks while they stream
//! (idem-http's `Recording`), on each store: a large body and an event
//! stream replayed byte for byte, the resident memory the first request
//! and the replay add, a replay's time to first byte against a bare
//! handler's, and first requests of small bodies with and without the
//! layer.
//!
//! `cargo run --release -p idem-bench --bin stream-bench -- --stores sqlite,postgres,redis`

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing;
use axum::Router;
use bytes::Bytes;
use clap::Parser;
use idem_core::Idempotent;
use idem_http::Options;
use idem_stores::StoreUrl;
use idem_testing::Server;
use idem_tower::IdempotencyLayer;
use sha2::{Digest, Sha256};

use crate::fixture::{self, BoxError};
use crate::markdown;

/// Measures chunked recording and replay on each store; prints a table
/// and, with `--markdown`, writes the same table into the file.
#[derive(Debug, Parser)]
#[command(name = "stream-bench", version)]
struct Args {
    /// The stores, by name: sqlite, postgres, redis, mysql, memory.
    #[arg(long, default_value = "sqlite,postgres,redis", value_delimiter = ',')]
    stores: Vec<String>,

    /// The large body, in MiB.
    #[arg(long, default_value_t = 100)]
    body_mib: u64,

    /// The events of the event stream.
    #[arg(long, default_value_t = 10_000)]
    events: usize,

    /// Rounds of the time-to-first-byte and small-body measures (medians).
    #[arg(long, default_value_t = 21)]
    reps: usize,

    /// Small-body first requests per round, per side.
    #[arg(long, default_value_t = 400)]
    requests: usize,

    /// A check that everything runs, not a measurement: 4 MiB, 1,000
    /// events, 3 rounds of 50 requests.
    #[arg(long)]
    quick: bool,

    /// PostgreSQL server.
    #[arg(
        long,
        env = Server::Postgres.env_var(),
        default_value = Server::Postgres.default_url()
    )]
    postgres_url: String,

    /// Redis server.
    #[arg(long, env = Server::Redis.env_var(), default_value = Server::Redis.default_url())]
    redis_url: String,

    /// MariaDB server.
    #[arg(
        long,
        env = Server::MySql.env_var(),
        default_value = Server::MySql.default_url()
    )]
    mysql_url: String,

    /// Rewrite the streamed-responses table in this Markdown file between
    /// its markers: `--markdown BENCHMARKS.md`.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

/// The frame size of the large body.
const FRAME: usize = 64 * 1024;

/// The small body: 16 KiB, recorded whole.
const SMALL: usize = 16 * 1024;

/// Runs the binary: reads its command line, measures, prints.
pub fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.quick {
        args.body_mib = 4;
        args.events = 1_000;
        args.reps = 3;
        args.requests = 50;
    }
    let runtime = match crate::cli::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("stream-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("stream-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let tag = fixture::run_tag();
    let memory = Rss::start();
    let mut rows = Vec::new();
    for name in &args.stores {
        let url = match name.as_str() {
            "sqlite" => format!("sqlite:{}", dir.path().join("stream.db").display()),
            "postgres" => args.postgres_url.clone(),
            "redis" => args.redis_url.clone(),
            "mysql" => args.mysql_url.clone(),
            other => other.to_owned(),
        };
        let url: StoreUrl = url.parse()?;
        let store = url.open_named(&format!("stream_{tag}")).await?;
        let idem = Idempotent::from_arc(store).with_namespace(format!("stream-{tag}"));
        let mut row = vec![name.clone()];
        row.extend(measure(args, idem, &memory).await?);
        eprintln!("stream-bench: {name} measured");
        rows.push(row);
    }
    let table = table(args.events, rows);
    print!("{table}");
    if let Some(path) = &args.markdown {
        markdown::rewrite(path, &[("streams", table)])?;
    }
    Ok(())
}

/// The table a run prints and writes: a row per store, its cells in the
/// order of the columns.
fn table(events: usize, rows: Vec<Vec<String>>) -> String {
    let events = format!("{events} events identical");
    let mut table = markdown::Table::new(&[
        "store",
        ">body",
        ">first: s, RSS + MiB",
        ">replay: s, RSS + MiB",
        "identical",
        &events,
        ">replay TTFB / bare (median)",
        ">16 KiB first requests / chunking off",
        ">/ bare",
    ]);
    for row in rows {
        table.row(row);
    }
    table.render()
}

/// One store's cells, after its name.
async fn measure(args: &Args, idem: Idempotent, memory: &Rss) -> Result<Vec<String>, BoxError> {
    let options = Options::from_idempotent(idem);
    // The same layer with chunked recording off: the build before it.
    let whole_only = serve(args, Some(options.clone().with_max_streamed_body(0))).await?;
    let layered = serve(args, Some(options)).await?;
    let bare = serve(args, None).await?;
    let client = reqwest::Client::new();
    let want = expected(args);

    let (first, first_rss) = memory.during(read(&client, &layered, "/body", "big")).await;
    let first = first?;
    let (replay, replay_rss) = memory.during(read(&client, &layered, "/body", "big")).await;
    let replay = replay?;
    let identical = first.digest == want && replay.digest == want && replay.replayed;

    let events_first = read(&client, &layered, "/events", "events").await?;
    let events_replay = read(&client, &layered, "/events", "events").await?;
    let events_identical = events_first.digest == events_replay.digest
        && events_replay.replayed
        && events_first.digest == expected_events(args.events);

    if !identical || !events_identical {
        return Err(format!(
            "a replay differs from its first response (body: {}, events: {})",
            yes(identical),
            yes(events_identical)
        )
        .into());
    }
    let mut ttfb = Vec::new();
    let mut small = Vec::new();
    let mut small_bare = Vec::new();
    for round in 0..args.reps {
        let replayed = read(&client, &layered, "/events", "events").await?;
        let plain = read(&client, &bare, "/events", &format!("bare-{round}")).await?;
        ttfb.push(replayed.first_byte.as_secs_f64() / plain.first_byte.as_secs_f64());
        let with = small_rate(&client, &layered, args.requests, round).await?;
        let before = small_rate(&client, &whole_only, args.requests, round).await?;
        let without = small_rate(&client, &bare, args.requests, round).await?;
        small.push(with / before);
        small_bare.push(with / without);
    }
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    Ok(vec![
        format!("{} MiB", args.body_mib),
        format!("{:.2}, +{:.1}", first.took.as_secs_f64(), mib(first_rss)),
        format!("{:.2}, +{:.1}", replay.took.as_secs_f64(), mib(replay_rss)),
        yes(identical).to_owned(),
        yes(events_identical).to_owned(),
        format!("{:.2}×", median(&mut ttfb)),
        format!("{:.2}×", median(&mut small)),
        format!("{:.2}×", median(&mut small_bare)),
    ])
}

fn yes(is: bool) -> &'static str {
    if is {
        "yes"
    } else {
        "NO"
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Serves `/body`, `/events` and `/small`, behind the layer when `options`
/// is given; returns the base URL.
async fn serve(args: &Args, options: Option<Options>) -> Result<String, BoxError> {
    let frames = args.body_mib * 1024 * 1024 / FRAME as u64;
    let events = args.events;
    let router = Router::new()
        .route(
            "/body",
            routing::post(move || async move {
                let stream = futures_util::stream::iter(
                    (0..frames).map(|index| Ok::<_, std::io::Error>(frame(index))),
                );
                axum::body::Body::from_stream(stream)
            }),
        )
        .route(
            "/events",
            routing::post(move || async move {
                let stream = futures_util::stream::iter(
                    (0..events).map(|i| Ok::<_, std::io::Error>(Bytes::from(event(i)))),
                );
                axum::body::Body::from_stream(stream)
            }),
        )
        .route("/small", routing::post(|| async { vec![b's'; SMALL] }));
    let router = match options {
        Some(options) => router.layer(IdempotencyLayer::from_options(options)),
        None => router,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(format!("http://{addr}"))
}

/// Frame `index` of the large body: no two frames alike.
fn frame(index: u64) -> Bytes {
    (0..FRAME)
        .map(|i| (i as u64 ^ index.wrapping_mul(0x9e37)) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn event(i: usize) -> String {
    format!("id: {i}\nevent: token\ndata: {{\"n\":{i}}}\n\n")
}

fn expected(args: &Args) -> [u8; 32] {
    let mut digest = Sha256::new();
    for index in 0..args.body_mib * 1024 * 1024 / FRAME as u64 {
        digest.update(frame(index));
    }
    digest.finalize().into()
}

fn expected_events(events: usize) -> [u8; 32] {
    let mut digest = Sha256::new();
    for i in 0..events {
        digest.update(event(i));
    }
    digest.finalize().into()
}

/// What a read of a streamed response found.
struct Read {
    digest: [u8; 32],
    first_byte: Duration,
    took: Duration,
    replayed: bool,
}

/// Posts to `path` under `key` and reads the body as it streams, keeping
/// only its digest.
async fn read(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
) -> Result<Read, BoxError> {
    let started = Instant::now();
    let mut response = client
        .post(format!("{base}{path}"))
        .header("idempotency-key", key)
        .header("prefer", "wait=30")
        .send()
        .await?;
    if !response.status().is_success() {
        return Err(format!("{path} answered {}", response.status()).into());
    }
    let replayed = response.headers().contains_key("idempotent-replayed");
    let mut digest = Sha256::new();
    let mut first_byte = None;
    while let Some(chunk) = response.chunk().await? {
        first_byte.get_or_insert_with(|| started.elapsed());
        digest.update(&chunk);
    }
    Ok(Read {
        digest: digest.finalize().into(),
        first_byte: first_byte.unwrap_or_else(|| started.elapsed()),
        took: started.elapsed(),
        replayed,
    })
}

/// First requests of the small body per second, each under a new key.
async fn small_rate(
    client: &reqwest::Client,
    base: &str,
    requests: usize,
    round: usize,
) -> Result<f64, BoxError> {
    let tag = fixture::run_tag();
    let started = Instant::now();
    for i in 0..requests {
        let response = client
            .post(format!("{base}/small"))
            .header("idempotency-key", format!("small-{tag}-{round}-{i}"))
            .send()
            .await?;
        let body = response.bytes().await?;
        if body.len() != SMALL {
            return Err("a small body came back short".into());
        }
    }
    Ok(requests as f64 / started.elapsed().as_secs_f64())
}

/// The process's resident memory, sampled every 5 ms while a measure runs.
struct Rss {
    peak: Arc<AtomicU64>,
    running: Arc<AtomicBool>,
}

impl Rss {
    fn start() -> Rss {
        let peak = Arc::new(AtomicU64::new(0));
        let running = Arc::new(AtomicBool::new(true));
        let (p, r) = (Arc::clone(&peak), Arc::clone(&running));
        std::thread::spawn(move || {
            while r.load(Ordering::Relaxed) {
                p.fetch_max(resident(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Rss { peak, running }
    }

    /// Runs `work` and returns how far the peak rose above the memory
    /// before it, in bytes.
    async fn during<T>(&self, work: impl std::future::Future<Output = T>) -> (T, u64) {
        let before = resident();
        self.peak.store(before, Ordering::Relaxed);
        let out = work.await;
        std::thread::sleep(Duration::from_millis(10));
        (
            out,
            self.peak.load(Ordering::Relaxed).saturating_sub(before),
        )
    }
}

impl Drop for Rss {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
    }
}

/// `VmRSS` from `/proc/self/status`, in bytes (0 where it cannot be read).
fn resident() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_table_is_the_one_written_between_the_markers() {
        let rows = vec![[
            "sqlite",
            "4 MiB",
            "0.10, +1.0",
            "0.02, +0.1",
            "yes",
            "yes",
            "0.35×",
            "0.98×",
            "0.90×",
        ]
        .map(str::to_owned)
        .to_vec()];
        let table = table(1_000, rows);
        assert_eq!(
            table,
            "| store | body | first: s, RSS + MiB | replay: s, RSS + MiB | identical \
             | 1000 events identical | replay TTFB / bare (median) \
             | 16 KiB first requests / chunking off | / bare |\n\
             |---|---:|---:|---:|---|---|---:|---:|---:|\n\
             | sqlite | 4 MiB | 0.10, +1.0 | 0.02, +0.1 | yes | yes | 0.35× | 0.98× | 0.90× |\n"
        );
        let card = format!(
            "# Card\n\nprose\n{}\n| old |\n{}\nmore prose\n",
            markdown::begin("streams"),
            markdown::end("streams")
        );
        let written = markdown::replace(&card, "streams", &table).unwrap();
        assert_eq!(
            written,
            format!(
                "# Card\n\nprose\n{}\n{table}{}\nmore prose\n",
                markdown::begin("streams"),
                markdown::end("streams")
            )
        );
    }
}
