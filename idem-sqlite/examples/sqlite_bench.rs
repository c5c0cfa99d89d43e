//! `execute` against the raw minimal protocol on one SQLite file, through
//! the same writer thread, for first executions and replays at concurrency
//! 1 and 32, with group commit off (`plain`) and on (`group`).
//!
//! ```text
//! cargo run --release -p idem-sqlite --example sqlite_bench -- [--secs 1] [--runs 3] [--sync full|normal|both] [--conc N]
//! ```
//!
//! The raw protocol is the bare claim statement (and, for a replay, the
//! read of the stored payload) and the bare complete statement; `execute`
//! adds keys, fingerprints, tokens, JSON and the state machine. Each phase
//! runs for `--secs` on a fresh file (replays cycle over the keys the first
//! phase recorded); each rate is the median of `--runs` runs. Raw and
//! `execute` run back to back, in alternating order, and each ratio is the
//! median of those pairs' ratios, so that a machine busy with other work
//! slows both sides of a ratio alike.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Idempotent, Store, Token};
use idem_sqlite::{SqliteStore, Synchronous, DEFAULT_MAX_BATCH};

const LEASE: Duration = Duration::from_secs(60);
const RETENTION: Duration = Duration::from_secs(24 * 3600);

#[derive(Clone, Copy, PartialEq)]
enum Protocol {
    Raw,
    Execute,
}

struct Options {
    secs: f64,
    runs: usize,
    syncs: Vec<Synchronous>,
    concurrencies: Vec<usize>,
}

fn options() -> Options {
    let mut options = Options {
        secs: 1.0,
        runs: 3,
        syncs: vec![Synchronous::Full, Synchronous::Normal],
        concurrencies: vec![1, 32],
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or_default();
        match pair[0].as_str() {
            "--secs" => options.secs = value.parse().expect("--secs takes a number"),
            "--runs" => options.runs = value.parse().expect("--runs takes a number"),
            "--sync" => {
                options.syncs = match value {
                    "full" => vec![Synchronous::Full],
                    "normal" => vec![Synchronous::Normal],
                    _ => vec![Synchronous::Full, Synchronous::Normal],
                }
            }
            "--conc" => options.concurrencies = vec![value.parse().expect("--conc takes a number")],
            other => panic!("unknown option {other}"),
        }
    }
    options
}

/// 100 bytes of JSON: a string of 98 characters in quotes.
fn outcome() -> String {
    "o".repeat(98)
}

/// Runs operations from `concurrency` tasks for `secs` and returns how
/// many ran and their rate per second. Operation `i` works on key `i`, or
/// on key `i % cycle` when replaying `cycle` recorded keys.
async fn measure<F, Fut>(
    secs: f64,
    concurrency: usize,
    cycle: Option<usize>,
    one: F,
) -> (usize, f64)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let one = Arc::new(one);
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (one, next, done) = (Arc::clone(&one), Arc::clone(&next), Arc::clone(&done));
            tokio::spawn(async move {
                while Instant::now() < until {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    one(cycle.map_or(i, |n| i % n)).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a benchmark task panicked");
    }
    let done = done.load(Ordering::Relaxed);
    (done, done as f64 / started.elapsed().as_secs_f64())
}

/// One run of one variant: a fresh file, first executions, then replays.
async fn run(
    protocol: Protocol,
    synchronous: Synchronous,
    max_batch: usize,
    secs: f64,
    concurrency: usize,
) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("bench.db"))
        .await
        .unwrap()
        .with_synchronous(synchronous)
        .with_max_batch(max_batch);
    let store = Arc::new(store);
    let mut recorded = None;
    let mut rates = [0.0; 2];
    for rate in &mut rates {
        let replay = recorded.is_some();
        let (count, per_second) = match protocol {
            Protocol::Raw => {
                let store = Arc::clone(&store);
                let payload = serde_json::to_vec(&outcome()).unwrap();
                measure(secs, concurrency, recorded, move |i| {
                    let (store, payload) = (Arc::clone(&store), payload.clone());
                    async move { raw(&store, i, &payload, replay).await }
                })
                .await
            }
            Protocol::Execute => {
                let idem = Idempotent::from_arc(Arc::clone(&store) as Arc<dyn Store>);
                measure(secs, concurrency, recorded, move |i| {
                    let idem = idem.clone();
                    async move {
                        let value: String = idem
                            .execute(&format!("k-{i}"), &i, || async {
                                Ok::<_, Infallible>(outcome())
                            })
                            .await
                            .expect("execute succeeds");
                        assert_eq!(value.len(), 98);
                    }
                })
                .await
            }
        };
        recorded = Some(count);
        *rate = per_second;
    }
    (rates[0], rates[1])
}

async fn raw(store: &SqliteStore, i: usize, payload: &[u8], replay: bool) {
    // The same storage key `execute` would use for this client key.
    let key = format!("0::0:k-{i}");
    let token = Token::random();
    let found = store
        .raw_claim(&key, token, LEASE, RETENTION)
        .await
        .unwrap();
    match (found, replay) {
        (None, false) => {
            let done = store.raw_complete(&key, token, payload, RETENTION).await;
            assert!(done.unwrap(), "the claimer completes");
        }
        (Some(stored), true) => assert_eq!(stored.len(), payload.len()),
        (found, _) => panic!("unexpected claim result {found:?}"),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let options = options();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "ops/s, median of {} runs of {} s per phase; ratio = median of execute / raw \
         measured back to back",
        options.runs, options.secs
    );
    println!(
        "{:<7} {:>4} {:<7} {:>10} {:>10} {:>10} {:>10} {:>6} {:>6}",
        "sync",
        "conc",
        "phase",
        "raw plain",
        "raw group",
        "exe plain",
        "exe group",
        "plain",
        "group"
    );
    let batches = [1, DEFAULT_MAX_BATCH];
    for &synchronous in &options.syncs {
        for &concurrency in &options.concurrencies {
            // rates[batch][protocol][run] = (first, replay)
            let mut rates = vec![vec![Vec::new(); 2]; batches.len()];
            for round in 0..options.runs {
                for (b, &batch) in batches.iter().enumerate() {
                    // Alternating which goes first cancels a machine that
                    // grows busier or quieter during the pair.
                    let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                    for p in order {
                        let protocol = [Protocol::Raw, Protocol::Execute][p];
                        let secs = options.secs;
                        let rate =
                            runtime.block_on(run(protocol, synchronous, batch, secs, concurrency));
                        rates[b][p].push(rate);
                    }
                }
            }
            for (phase, pick) in [("first", 0), ("replay", 1)] {
                let of = |r: (f64, f64)| if pick == 0 { r.0 } else { r.1 };
                let rate =
                    |b: usize, p: usize| median(rates[b][p].iter().map(|&r| of(r)).collect());
                let ratio = |b: usize| {
                    median(
                        rates[b][1]
                            .iter()
                            .zip(&rates[b][0])
                            .map(|(&exe, &raw)| of(exe) / of(raw))
                            .collect(),
                    )
                };
                println!(
                    "{:<7} {:>4} {:<7} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>6.2} {:>6.2}",
                    format!("{synchronous:?}"),
                    concurrency,
                    phase,
                    rate(0, 0),
                    rate(1, 0),
                    rate(0, 1),
                    rate(1, 1),
                    ratio(0),
                    ratio(1),
                );
            }
        }
    }
}
