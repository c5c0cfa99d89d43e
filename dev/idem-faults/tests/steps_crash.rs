//! Durable steps under kill -9, on PostgreSQL and SQLite.
//!
//! Each trial runs a `steps-worker` process on a key of its own: a
//! three-step operation — a transactional step (a business row and its
//! journal entry in one transaction), a remote call through a derived key
//! to a fake API this test runs (it counts effects per operation), and a
//! plain step (a line appended to a file) — and kills it with SIGKILL at
//! one of eight points: before each step, inside each step after its
//! effect and before its record, after the last step, and after the
//! completion. Once the leases lapse one recovery worker resumes every
//! key. Then every key must be finished by the recovery, hold exactly one
//! business row and exactly one remote effect, and have run its plain step
//! once, or twice when the kill came inside it (at most once per crash);
//! every acknowledged outcome must be that row and that remote effect.
//!
//! Trial count: `IDEM_STEPS_KILLS` kills per store (default 16, two per
//! point).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_faults::{postgres_url, unique_name, Backend};
use idem_postgres::PostgresStore;
use idem_sqlite::SqliteStore;
use idem_testing::StoreKind;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const POINTS: [&str; 8] = [
    "before-tx",
    "inside-tx",
    "after-tx",
    "inside-remote",
    "after-remote",
    "inside-plain",
    "after-plain",
    "after-complete",
];
const LEASE_MS: u64 = 400;

fn kills() -> usize {
    std::env::var("IDEM_STEPS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}

fn point_of(key: &str) -> &'static str {
    POINTS[key[1..].parse::<usize>().unwrap() % POINTS.len()]
}

/// The fake remote idempotent API: one effect per idempotency key.
#[derive(Default)]
struct Api {
    /// Derived key → (operation key, the nonce kept by its one effect).
    kept: HashMap<String, (String, String)>,
    /// Operation key → effects run, calls received.
    by_operation: HashMap<String, (usize, usize)>,
}

async fn serve_api() -> (String, Arc<Mutex<Api>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let api = Arc::new(Mutex::new(Api::default()));
    let shared = Arc::clone(&api);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let api = Arc::clone(&shared);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut line = String::new();
                if BufReader::new(read).read_line(&mut line).await.is_err() {
                    return;
                }
                let words: Vec<&str> = line.split_whitespace().collect();
                let [derived, operation, nonce] = words[..] else {
                    return;
                };
                let answer = {
                    let mut api = api.lock().unwrap();
                    let fresh = !api.kept.contains_key(derived);
                    let counts = api.by_operation.entry(operation.to_owned()).or_default();
                    counts.1 += 1;
                    if fresh {
                        counts.0 += 1;
                    }
                    api.kept
                        .entry(derived.to_owned())
                        .or_insert_with(|| (operation.to_owned(), nonce.to_owned()))
                        .1
                        .clone()
                };
                let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
            });
        }
    });
    (addr, api)
}

struct Setup {
    backend: Backend,
    charges: String,
    api: String,
    plain: String,
}

/// Starts a `steps-worker` process; the handle gives its stdout.
fn worker(setup: &Setup, point: &str, keys: String) -> tokio::task::JoinHandle<String> {
    let (point, backend) = (point.to_owned(), setup.backend.clone());
    let args = [
        point,
        keys,
        LEASE_MS.to_string(),
        setup.charges.clone(),
        setup.api.clone(),
        setup.plain.clone(),
    ];
    tokio::task::spawn_blocking(move || {
        let output = Command::new(env!("CARGO_BIN_EXE_steps-worker"))
            .args(args)
            .args(backend.to_args())
            .output()
            .expect("the worker runs");
        String::from_utf8_lossy(&output.stdout).into_owned()
    })
}

async fn trials<F, Fut>(setup: Setup, api: Arc<Mutex<Api>>, rows: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = HashMap<String, Vec<String>>>,
{
    let kills = kills();
    let keys: Vec<String> = (0..kills).map(|i| format!("s{i}")).collect();
    let mut before: Vec<String> = Vec::new();
    // Four workers at a time: each trial is one short process.
    for chunk in keys.chunks(4) {
        let runs: Vec<_> = chunk
            .iter()
            .map(|key| worker(&setup, point_of(key), key.clone()))
            .collect();
        for run in runs {
            before.push(run.await.unwrap());
        }
    }
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 200)).await;
    let recovered = worker(&setup, "none", keys.join(",")).await.unwrap();

    let rows = rows().await;
    let api = api.lock().unwrap();
    let plain = std::fs::read_to_string(&setup.plain).unwrap_or_default();
    let mut plain_runs: HashMap<&str, usize> = HashMap::new();
    for line in plain.lines() {
        *plain_runs.entry(line).or_default() += 1;
    }

    let mut finished: HashMap<String, (String, String)> = HashMap::new();
    let mut wrong = 0;
    for line in before.iter().flat_map(|out| out.lines()) {
        // Only the "none" recovery and a kill after the completion can
        // acknowledge; compare what they acknowledged below.
        let words: Vec<&str> = line.split(' ').collect();
        assert!(
            matches!(words.as_slice(), ["acked", _, _, "ran"]),
            "a killed worker answered: {line}"
        );
    }
    for line in recovered.lines() {
        match line.split(' ').collect::<Vec<_>>().as_slice() {
            ["acked", key, value, how] => {
                finished.insert(key.to_string(), (value.to_string(), how.to_string()));
            }
            _ => panic!("the recovery did not finish a key: {line}"),
        }
    }
    let (mut rows_off, mut remote_off, mut plain_off, mut resumed, mut replayed) = (0, 0, 0, 0, 0);
    for key in &keys {
        let point = point_of(key);
        let Some((value, how)) = finished.get(key) else {
            panic!("{key} (killed {point}) was not finished by the recovery");
        };
        if how == "ran" {
            resumed += 1;
        } else {
            replayed += 1;
        }
        let row = match rows.get(key).map(Vec::as_slice) {
            Some([row]) => row.clone(),
            other => {
                rows_off += 1;
                println!("{key} (killed {point}): business rows {other:?}");
                continue;
            }
        };
        let effects = api.by_operation.get(key).map_or(0, |c| c.0);
        if effects != 1 {
            remote_off += 1;
            println!("{key} (killed {point}): {effects} remote effects");
        }
        let kept = api
            .kept
            .values()
            .find(|(op, _)| op == key)
            .map(|(_, n)| n.clone())
            .unwrap_or_default();
        if *value != format!("{row}/{kept}") {
            wrong += 1;
        }
        let expected_plain = if point == "inside-plain" { 2 } else { 1 };
        if plain_runs.get(key.as_str()).copied().unwrap_or(0) != expected_plain {
            plain_off += 1;
            println!(
                "{key} (killed {point}): plain step ran {:?} times",
                plain_runs.get(key.as_str())
            );
        }
        // Killed after the completion: replayed; anywhere else: resumed.
        assert_eq!(
            how == "replayed",
            point == "after-complete",
            "{key} killed {point}: {how}"
        );
    }
    let calls: usize = api.by_operation.values().map(|c| c.1).sum();
    println!(
        "{}: {kills} kills; finished {}/{kills} ({resumed} resumed, {replayed} replayed); \
         business rows off {rows_off}, remote effects off {remote_off} ({calls} calls), \
         plain step off {plain_off}, acknowledged but not the effects {wrong}",
        setup.backend.name(),
        finished.len()
    );
    assert_eq!((rows_off, remote_off, plain_off, wrong), (0, 0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_steps_killed_at_every_point_run_each_effect_once() {
    let Some(url) = postgres_url() else { return };
    let table = unique_name("steps_records");
    let charges = unique_name("steps_charges");
    let store = PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::raw_sql(&format!(
        "CREATE TABLE {charges} (key text NOT NULL, nonce text NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (api, counts) = serve_api().await;
    let setup = Setup {
        backend: Backend::new(StoreKind::Postgres, url, table.clone()),
        charges: charges.clone(),
        api,
        plain: dir.path().join("plain.log").display().to_string(),
    };
    let (pool, read) = (store.pool().clone(), charges.clone());
    trials(setup, counts, || {
        let (pool, read) = (pool.clone(), read.clone());
        async move {
            let rows: Vec<(String, String)> =
                sqlx::query_as(&format!("SELECT key, nonce FROM {read}"))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
            for (key, nonce) in rows {
                by_key.entry(key).or_default().push(nonce);
            }
            by_key
        }
    })
    .await;
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {charges}"
    ))
    .execute(store.pool())
    .await
    .unwrap();
}

fn sqlite_rows(path: &Path) -> HashMap<String, Vec<String>> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn.prepare("SELECT key, nonce FROM charges").unwrap();
    let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
    for row in statement
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .unwrap()
    {
        let (key, nonce) = row.unwrap();
        by_key.entry(key).or_default().push(nonce);
    }
    by_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_steps_killed_at_every_point_run_each_effect_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("steps.db");
    drop(SqliteStore::open(&path).await.unwrap());
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE charges (key TEXT NOT NULL, nonce TEXT NOT NULL)")
        .unwrap();
    let (api, counts) = serve_api().await;
    let setup = Setup {
        backend: Backend::sqlite(&path),
        charges: "charges".to_owned(),
        api,
        plain: dir.path().join("plain.log").display().to_string(),
    };
    trials(setup, counts, || {
        let path = path.clone();
        async move { sqlite_rows(&path) }
    })
    .await;
}
