//! A worker process for the durable-steps crash trials: for each key it
//! runs a three-step operation — a transactional step (a business row and
//! its journal entry in one transaction), a remote call through a derived
//! key to the fake API the test runs, and a plain step (a line appended to
//! a file) — and may kill itself with SIGKILL at one chosen point.
//!
//! Usage: `steps-worker POINT KEYS LEASE_MS CHARGES API_ADDR PLAIN_FILE
//! BACKEND...`. POINT is `none` or one of the test's `POINTS`: every step boundary
//! and inside every step (after its effect, before its record). The fake
//! API speaks one line each way: `DERIVED_KEY OP_KEY NONCE` in, the nonce
//! it kept for that derived key out. The worker prints
//! `acked KEY ROW/REMOTE ran|replayed` for every outcome it would
//! acknowledge, or `error KEY MESSAGE`.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Error, Idempotent};
use idem_faults::Backend;
use idem_postgres::PostgresStore;
use idem_sqlite::SqliteStore;
use idem_testing::StoreKind;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn die() -> ! {
    let _ = Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    std::thread::sleep(Duration::from_secs(3600));
    std::process::exit(9)
}

#[derive(Clone)]
enum Sql {
    Postgres(PostgresStore),
    Sqlite(SqliteStore),
}

#[derive(Clone)]
struct Trial {
    point: String,
    charges: String,
    api: String,
    plain: String,
}

impl Trial {
    fn at(&self, here: &str) {
        if self.point == here {
            die();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (
        Some(point),
        Some(keys),
        Some(lease),
        Some(charges),
        Some(api),
        Some(plain),
        Some(backend),
    ) = (
        args.first().cloned(),
        args.get(1).cloned(),
        args.get(2).and_then(|l| l.parse::<u64>().ok()),
        args.get(3).cloned(),
        args.get(4).cloned(),
        args.get(5).cloned(),
        args.get(6..).and_then(Backend::from_args),
    )
    else {
        eprintln!("usage: steps-worker POINT KEYS LEASE_MS CHARGES API_ADDR PLAIN_FILE BACKEND...");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let sql = match backend.kind() {
            StoreKind::Postgres => Sql::Postgres(
                PostgresStore::connect(backend.location())
                    .await
                    .and_then(|s| s.with_table(backend.scope()))
                    .expect("the store opens"),
            ),
            StoreKind::Sqlite => Sql::Sqlite(
                SqliteStore::open(backend.location())
                    .await
                    .expect("the store opens"),
            ),
            _ => {
                eprintln!("steps-worker: {backend:?} has no transactional steps yet");
                std::process::exit(2);
            }
        };
        let store: Arc<dyn idem_core::store::Store> = match &sql {
            Sql::Postgres(store) => Arc::new(store.clone()),
            Sql::Sqlite(store) => Arc::new(store.clone()),
        };
        let idem = Idempotent::from_arc(store).with_lease(Duration::from_millis(lease));
        let trial = Trial {
            point,
            charges,
            api,
            plain,
        };
        for key in keys.split(',') {
            run(&idem, &sql, &trial, key).await;
        }
    });
}

async fn run(idem: &Idempotent, sql: &Sql, trial: &Trial, key: &str) {
    let outcome = loop {
        // Set when the work starts: a replay never calls it.
        let mut ran = false;
        let result = idem
            .execute_steps(key, key, |steps| {
                ran = true;
                operation(steps, sql.clone(), trial.clone(), key.to_owned())
            })
            .await;
        match result {
            Err(Error::InProgress { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            other => break other.map(|value| (value, ran)),
        }
    };
    match outcome {
        Ok((value, ran)) => {
            trial.at("after-complete");
            ack(key, &value, if ran { "ran" } else { "replayed" });
        }
        Err(error) => println!("error {key} {error}"),
    }
}

/// The three steps; the outcome is the business row's nonce and the nonce
/// the remote API kept, `ROW/REMOTE`.
async fn operation(
    steps: idem_core::Steps,
    sql: Sql,
    trial: Trial,
    key: String,
) -> Result<String, Error<String>> {
    trial.at("before-tx");
    let nonce = format!("{:016x}", rand::random::<u64>());
    let row: String = match &sql {
        Sql::Postgres(store) => {
            let (trial, key, nonce) = (trial.clone(), key.clone(), nonce.clone());
            store
                .step_in_tx(&steps, "reserve", move |tx| {
                    Box::pin(async move {
                        sqlx::query(&format!(
                            "INSERT INTO {} (key, nonce) VALUES ($1, $2)",
                            trial.charges
                        ))
                        .bind(&key)
                        .bind(&nonce)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| e.to_string())?;
                        trial.at("inside-tx");
                        Ok(nonce)
                    })
                })
                .await?
        }
        Sql::Sqlite(store) => {
            let (trial, key, nonce) = (trial.clone(), key.clone(), nonce.clone());
            store
                .step_in_tx(&steps, "reserve", move |conn| {
                    conn.execute(
                        &format!("INSERT INTO {} (key, nonce) VALUES (?1, ?2)", trial.charges),
                        [&key, &nonce],
                    )
                    .map_err(|e| e.to_string())?;
                    trial.at("inside-tx");
                    Ok(nonce)
                })
                .await?
        }
    };
    trial.at("after-tx");
    let remote: String = steps
        .remote("email", |derived| {
            let (trial, key) = (trial.clone(), key.clone());
            async move {
                let kept = call_api(&trial.api, &derived, &key).await?;
                trial.at("inside-remote");
                Ok(kept)
            }
        })
        .await?;
    trial.at("after-remote");
    let _: u32 = steps
        .step("log", || {
            let (trial, key) = (trial.clone(), key.clone());
            async move {
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&trial.plain)
                    .map_err(|e| e.to_string())?;
                // One write per line: four workers append to this file at
                // once, and `writeln!` may split a line into two writes.
                file.write_all(format!("{key}\n").as_bytes())
                    .map_err(|e| e.to_string())?;
                trial.at("inside-plain");
                Ok(1)
            }
        })
        .await?;
    trial.at("after-plain");
    Ok(format!("{row}/{remote}"))
}

/// One call to the fake remote API: it runs the effect once per derived
/// key and answers every call with the nonce it kept.
async fn call_api(addr: &str, derived: &str, key: &str) -> Result<String, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (read, mut write) = stream.into_split();
    let nonce = format!("{:016x}", rand::random::<u64>());
    write
        .write_all(format!("{derived} {key} {nonce}\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(read)
        .read_line(&mut line)
        .await
        .map_err(|e| e.to_string())?;
    Ok(line.trim().to_owned())
}

fn ack(key: &str, value: &str, how: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "acked {key} {value} {how}");
    let _ = out.flush();
}
