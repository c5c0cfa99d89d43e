//! Exactly-once effects under kill -9: transactional completion on
//! PostgreSQL, MariaDB and SQLite.
//!
//! Each trial runs a `tx-worker` process on a key of its own and kills it
//! with SIGKILL at one of five points: before the claim, inside the work
//! before its business write, after the write before the completion,
//! between the completion and the commit, after the commit. Once the
//! leases lapse one recovery worker settles every key. Then each key must
//! have exactly one business row (0 lost, 0 duplicated) and every
//! acknowledged outcome must equal its row. Also: a connection terminated
//! while the work, the completion or the commit runs, and a stale owner
//! racing a taker-over in generated interleavings.
//!
//! MariaDB gets the same kill trials and races, and its own cut: `KILL`
//! of the transaction's connection.
//!
//! Trial counts: `IDEM_TX_KILLS` kills per store (default 25, five per
//! point), `IDEM_TX_CUTS` terminated connections (default 40),
//! `IDEM_TX_INTERLEAVINGS` races per store (default 200).

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Begin, Error, Fingerprint, Idempotent, Lease};
use idem_faults::{mysql_url, postgres_url, unique_name, Backend};
use idem_mysql::MySqlStore;
use idem_postgres::PostgresStore;
use idem_sqlite::{Settle, SqliteStore};
use idem_testing::StoreKind;
use rand::Rng;

const POINTS: [&str; 5] = [
    "before-claim",
    "before-write",
    "after-write",
    "after-complete",
    "after-commit",
];
const LEASE_MS: u64 = 400;

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `tx-worker` and returns its stdout.
fn worker(point: &str, keys: &str, charges: &str, backend: &Backend) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tx-worker"))
        .args([point, keys, &LEASE_MS.to_string(), charges])
        .args(backend.to_args())
        .output()
        .expect("the worker runs");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Kills a worker at every point in turn, recovers every key, and checks
/// the business rows `rows` reads back (key → nonces).
async fn kill_trials<F, Fut>(backend: Backend, charges: &str, rows: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = HashMap<String, Vec<String>>>,
{
    let kills = count("IDEM_TX_KILLS", 25);
    let keys: Vec<String> = (0..kills).map(|i| format!("t{i}")).collect();
    // Four workers at a time: each trial is one short process.
    let mut acked: Vec<String> = Vec::new();
    for chunk in keys.chunks(4) {
        let handles: Vec<_> = chunk
            .iter()
            .map(|key| {
                let index: usize = key[1..].parse().unwrap();
                let (backend, charges, key) = (backend.clone(), charges.to_owned(), key.clone());
                std::thread::spawn(move || {
                    worker(POINTS[index % POINTS.len()], &key, &charges, &backend)
                })
            })
            .collect();
        for handle in handles {
            acked.push(handle.join().unwrap());
        }
    }
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 200)).await;
    let recovered = worker("none", &keys.join(","), charges, &backend);
    let rows = rows().await;

    let mut by_point: HashMap<&str, (usize, usize)> = HashMap::new();
    let (mut lost, mut doubled, mut wrong) = (0, 0, 0);
    for line in acked.iter().chain([&recovered]).flat_map(|out| out.lines()) {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["acked", key, value, how] => {
                if rows.get(*key).map(Vec::as_slice) != Some(&[value.to_string()][..]) {
                    wrong += 1;
                }
                let index: usize = key[1..].parse().unwrap();
                let entry = by_point.entry(POINTS[index % POINTS.len()]).or_default();
                if *how == "replayed" {
                    entry.1 += 1;
                } else {
                    entry.0 += 1;
                }
            }
            _ => panic!("unexpected worker output: {line}"),
        }
    }
    for key in &keys {
        match rows.get(key).map(Vec::len) {
            None | Some(0) => lost += 1,
            Some(1) => {}
            Some(_) => doubled += 1,
        }
    }
    println!(
        "{}: {kills} kills; lost {lost}, duplicated {doubled}, acknowledged but not the row {wrong}",
        backend.name()
    );
    for point in POINTS {
        let (ran, replayed) = by_point.get(point).copied().unwrap_or_default();
        println!("  {point:<15} recovery ran {ran:>5}, replayed {replayed:>5}");
    }
    assert_eq!((lost, doubled, wrong), (0, 0, 0));
    // Before the commit nothing landed, so recovery must run the work;
    // after it, recovery must replay.
    for point in ["before-claim", "before-write", "after-write"] {
        assert_eq!(by_point.get(point).map_or(0, |p| p.1), 0, "{point}");
    }
    assert_eq!(by_point.get("after-commit").map_or(0, |p| p.0), 0);
}

async fn pg_fixture(url: &str) -> (PostgresStore, String, String) {
    let table = unique_name("tx_records");
    let charges = unique_name("tx_charges");
    let store = PostgresStore::connect(url)
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
    (store, table, charges)
}

async fn pg_drop(store: &PostgresStore, table: &str, charges: &str) {
    sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {charges}"
    ))
    .execute(store.pool())
    .await
    .unwrap();
}

async fn pg_rows(store: &PostgresStore, charges: &str) -> HashMap<String, Vec<String>> {
    let rows: Vec<(String, String)> = sqlx::query_as(&format!("SELECT key, nonce FROM {charges}"))
        .fetch_all(store.pool())
        .await
        .unwrap();
    let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
    for (key, nonce) in rows {
        by_key.entry(key).or_default().push(nonce);
    }
    by_key
}

async fn my_fixture(url: &str) -> (MySqlStore, String, String) {
    let table = unique_name("tx_records");
    let charges = unique_name("tx_charges");
    let store = MySqlStore::connect(url)
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::raw_sql(&format!(
        "CREATE TABLE {charges} (`key` VARCHAR(64) NOT NULL, nonce VARCHAR(64) NOT NULL) \
         ENGINE = InnoDB"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    (store, table, charges)
}

async fn my_drop(store: &MySqlStore, table: &str, charges: &str) {
    for name in [table, charges] {
        sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {name}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

async fn my_rows(store: &MySqlStore, charges: &str) -> HashMap<String, Vec<String>> {
    let rows: Vec<(String, String)> =
        sqlx::query_as(&format!("SELECT `key`, nonce FROM {charges}"))
            .fetch_all(store.pool())
            .await
            .unwrap();
    let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
    for (key, nonce) in rows {
        by_key.entry(key).or_default().push(nonce);
    }
    by_key
}

fn sqlite_rows(path: &std::path::Path, charges: &str) -> HashMap<String, Vec<String>> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn
        .prepare(&format!("SELECT key, nonce FROM {charges}"))
        .unwrap();
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
async fn postgres_kill_9_at_every_point_loses_and_duplicates_no_business_row() {
    let Some(url) = postgres_url() else { return };
    let (store, table, charges) = pg_fixture(&url).await;
    let backend = Backend::new(StoreKind::Postgres, url, table.clone());
    kill_trials(backend, &charges, || pg_rows(&store, &charges)).await;
    pg_drop(&store, &table, &charges).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_kill_9_at_every_point_loses_and_duplicates_no_business_row() {
    let Some(url) = mysql_url() else { return };
    let (store, table, charges) = my_fixture(&url).await;
    let backend = Backend::new(StoreKind::MySql, url, table.clone());
    kill_trials(backend, &charges, || my_rows(&store, &charges)).await;
    my_drop(&store, &table, &charges).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_kill_9_at_every_point_loses_and_duplicates_no_business_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tx.db");
    drop(SqliteStore::open(&path).await.unwrap());
    let charges = "charges";
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE charges (key TEXT NOT NULL, nonce TEXT NOT NULL)")
        .unwrap();
    let backend = Backend::sqlite(&path);
    let rows_path = path.clone();
    kill_trials(backend, charges, || {
        let path = rows_path.clone();
        async move { sqlite_rows(&path, charges) }
    })
    .await;
}

/// A connection terminated (`pg_terminate_backend`) at a random moment
/// while the work, the fenced completion or the COMMIT runs: the call
/// fails or succeeds, retries settle the key, and it never holds two rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_cut_during_commit_never_duplicates() {
    let Some(url) = postgres_url() else { return };
    let (store, table, charges) = pg_fixture(&url).await;
    let idem = Idempotent::new(store.clone()).with_lease(Duration::from_millis(150));
    let cuts = count("IDEM_TX_CUTS", 40);
    let (mut failed, mut acked) = (0, HashMap::new());
    for i in 0..cuts {
        let key = format!("cut{i}");
        let delay = rand::rng().random_range(0..3000);
        let (pool, charges_table, key_row) = (store.pool().clone(), charges.clone(), key.clone());
        let (cut, was_cut) = tokio::sync::oneshot::channel::<()>();
        let first: Result<String, Error<sqlx::Error>> = store
            .execute_in_tx(&idem, &key, &key, move |tx| {
                Box::pin(async move {
                    let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
                        .fetch_one(&mut *tx)
                        .await?;
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_micros(delay)).await;
                        let _ = sqlx::query("SELECT pg_terminate_backend($1)")
                            .bind(pid)
                            .execute(&pool)
                            .await;
                        let _ = cut.send(());
                    });
                    let nonce = format!("{:016x}", rand::random::<u64>());
                    sqlx::query(&format!(
                        "INSERT INTO {charges_table} (key, nonce) VALUES ($1, $2)"
                    ))
                    .bind(&key_row)
                    .bind(&nonce)
                    .execute(&mut *tx)
                    .await?;
                    Ok(nonce)
                })
            })
            .await;
        if first.is_err() {
            failed += 1;
        }
        // The cut may land after the call returned, on the connection idle
        // in the pool: wait for it, so no later statement meets it unseen
        // (the pool tests a connection before handing it out).
        let _ = was_cut.await;
        // Retry (without a cut) until the key is settled, as a client would.
        let charges_table = charges.clone();
        let value = loop {
            let key_row = key.clone();
            let sql = format!("INSERT INTO {charges_table} (key, nonce) VALUES ($1, $2)");
            let again: Result<String, Error<sqlx::Error>> = store
                .execute_in_tx(&idem, &key, &key, move |tx| {
                    Box::pin(async move {
                        let nonce = format!("{:016x}", rand::random::<u64>());
                        sqlx::query(&sql)
                            .bind(&key_row)
                            .bind(&nonce)
                            .execute(&mut *tx)
                            .await?;
                        Ok(nonce)
                    })
                })
                .await;
            match again {
                Ok(value) => break value,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        if let Ok(told) = &first {
            assert_eq!(told, &value, "a told outcome changed");
        }
        acked.insert(key, value);
    }
    let rows = pg_rows(&store, &charges).await;
    let doubled = rows.values().filter(|nonces| nonces.len() > 1).count();
    let wrong = acked
        .iter()
        .filter(|(key, value)| rows.get(*key) != Some(&vec![(*value).clone()]))
        .count();
    println!("postgres: {cuts} connections cut, {failed} first calls failed; duplicated {doubled}, not the row {wrong}");
    pg_drop(&store, &table, &charges).await;
    assert_eq!((doubled, wrong), (0, 0));
    assert_eq!(rows.len(), cuts);
}

/// A connection killed (`KILL`) at a random moment while the work, the
/// fenced completion or the COMMIT runs on MariaDB: the call fails or
/// succeeds, retries settle the key, and it never holds two rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_a_connection_killed_during_commit_never_duplicates() {
    let Some(url) = mysql_url() else { return };
    let (store, table, charges) = my_fixture(&url).await;
    let idem = Idempotent::new(store.clone()).with_lease(Duration::from_millis(150));
    let cuts = count("IDEM_TX_CUTS", 40);
    let insert = format!("INSERT INTO {charges} (`key`, nonce) VALUES (?, ?)");
    let (mut failed, mut acked) = (0, HashMap::new());
    for i in 0..cuts {
        let key = format!("cut{i}");
        let delay = rand::rng().random_range(0..3000);
        let (pool, sql, key_row) = (store.pool().clone(), insert.clone(), key.clone());
        let (cut, was_cut) = tokio::sync::oneshot::channel::<()>();
        let first: Result<String, Error<sqlx::Error>> = store
            .execute_in_tx(&idem, &key, &key, move |tx| {
                Box::pin(async move {
                    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                        .fetch_one(&mut *tx)
                        .await?;
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_micros(delay)).await;
                        let _ = sqlx::raw_sql(&format!("KILL {id}")).execute(&pool).await;
                        let _ = cut.send(());
                    });
                    let nonce = format!("{:016x}", rand::random::<u64>());
                    sqlx::query(&sql)
                        .bind(&key_row)
                        .bind(&nonce)
                        .execute(&mut *tx)
                        .await?;
                    Ok(nonce)
                })
            })
            .await;
        if first.is_err() {
            failed += 1;
        }
        // The kill may land after the call returned, on the connection idle
        // in the pool: wait for it, so no later statement meets it unseen
        // (the pool tests a connection before handing it out).
        let _ = was_cut.await;
        // Retry (without a kill) until the key is settled, as a client would.
        let value = loop {
            let (sql, key_row) = (insert.clone(), key.clone());
            let again: Result<String, Error<sqlx::Error>> = store
                .execute_in_tx(&idem, &key, &key, move |tx| {
                    Box::pin(async move {
                        let nonce = format!("{:016x}", rand::random::<u64>());
                        sqlx::query(&sql)
                            .bind(&key_row)
                            .bind(&nonce)
                            .execute(&mut *tx)
                            .await?;
                        Ok(nonce)
                    })
                })
                .await;
            match again {
                Ok(value) => break value,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        if let Ok(told) = &first {
            assert_eq!(told, &value, "a told outcome changed");
        }
        acked.insert(key, value);
    }
    let rows = my_rows(&store, &charges).await;
    let doubled = rows.values().filter(|nonces| nonces.len() > 1).count();
    let wrong = acked
        .iter()
        .filter(|(key, value)| rows.get(*key) != Some(&vec![(*value).clone()]))
        .count();
    println!("mysql: {cuts} connections killed, {failed} first calls failed; duplicated {doubled}, not the row {wrong}");
    my_drop(&store, &table, &charges).await;
    assert_eq!((doubled, wrong), (0, 0));
    assert_eq!(rows.len(), cuts);
}

/// One generated race: a stale owner (its lease lapsed) completes in its
/// transaction while a taker-over claims the key, each after a random
/// pause. Returns whether the stale owner's commit landed after a takeover
/// (a stale commit), and the rows the key holds.
enum Sql {
    Postgres(PostgresStore),
    Maria(MySqlStore),
    Sqlite(SqliteStore),
}

impl Sql {
    /// Writes a row for `owner` and completes `lease` in one transaction.
    async fn settle(&self, lease: &Lease, charges: &str, owner: &str) -> Result<(), Error> {
        let key = lease.key().client_key().to_owned();
        match self {
            Sql::Postgres(store) => {
                let mut tx = store.pool().begin().await.unwrap();
                sqlx::query(&format!(
                    "INSERT INTO {charges} (key, nonce) VALUES ($1, $2)"
                ))
                .bind(&key)
                .bind(owner)
                .execute(&mut *tx)
                .await
                .unwrap();
                let done = store
                    .complete_in(&mut tx, lease.clone(), owner.as_bytes())
                    .await?;
                done.commit(tx.commit()).await.unwrap();
                Ok(())
            }
            Sql::Maria(store) => {
                let mut tx = store.pool().begin().await.unwrap();
                sqlx::query(&format!(
                    "INSERT INTO {charges} (`key`, nonce) VALUES (?, ?)"
                ))
                .bind(&key)
                .bind(owner)
                .execute(&mut *tx)
                .await
                .unwrap();
                let done = store
                    .complete_in(&mut tx, lease.clone(), owner.as_bytes())
                    .await?;
                done.commit(tx.commit()).await.unwrap();
                Ok(())
            }
            Sql::Sqlite(store) => {
                let (sql, owner) = (
                    format!("INSERT INTO {charges} (key, nonce) VALUES (?1, ?2)"),
                    owner.to_owned(),
                );
                store
                    .settle_in_tx(lease, move |conn| {
                        conn.execute(&sql, [&key, &owner]).unwrap();
                        Settle::Complete(owner.into_bytes())
                    })
                    .await
            }
        }
    }
}

async fn races(
    sql: Arc<Sql>,
    idem: Idempotent,
    charges: String,
    rows: impl Fn() -> HashMap<String, Vec<String>>,
) {
    let n = count("IDEM_TX_INTERLEAVINGS", 200);
    let lease = idem.lease();
    // A few races at a time, so that each one's timing is its own.
    let running = Arc::new(tokio::sync::Semaphore::new(4));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (sql, idem, charges) = (Arc::clone(&sql), idem.clone(), charges.clone());
            let running = Arc::clone(&running);
            tokio::spawn(async move {
                let _turn = running.acquire_owned().await.unwrap();
                let key = format!("race{i}");
                let fingerprint = Fingerprint::of_bytes(b"race");
                let Ok(Begin::Run(stale)) = idem.begin(&key, fingerprint).await else {
                    panic!("a fresh key is claimed");
                };
                tokio::time::sleep(lease + Duration::from_millis(2)).await;
                // Which side starts first, and how long the other waits:
                // up to a few commits (each one an fsync), so that either
                // side may be anywhere in its steps when the other starts.
                let (stale_pause, taker_pause) = {
                    let mut rng = rand::rng();
                    let lag = rng.random_range(0..20_000);
                    if rng.random_bool(0.5) {
                        (0, lag)
                    } else {
                        (lag, 0)
                    }
                };
                let stale_side = {
                    let (sql, charges) = (Arc::clone(&sql), charges.clone());
                    async move {
                        tokio::time::sleep(Duration::from_micros(stale_pause)).await;
                        sql.settle(&stale, &charges, "stale").await
                    }
                };
                let taker_side = async {
                    tokio::time::sleep(Duration::from_micros(taker_pause)).await;
                    loop {
                        match idem.begin(&key, fingerprint).await {
                            Ok(Begin::Run(taker)) => {
                                return Some(sql.settle(&taker, &charges, "taker").await)
                            }
                            Ok(Begin::Replay(_)) => return None,
                            Ok(other) => panic!("{other:?}"),
                            Err(Error::InProgress { .. }) => {
                                tokio::time::sleep(Duration::from_millis(1)).await
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                };
                let (stale, taker) = tokio::join!(stale_side, taker_side);
                let record = idem
                    .store()
                    .load(idem.key(&key).unwrap().as_str())
                    .await
                    .unwrap()
                    .unwrap();
                (key, stale.is_ok(), taker.map(|t| t.is_ok()), record.payload)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let rows = rows();
    let (mut stale_commits, mut stale_won, mut taker_won) = (0, 0, 0);
    let mut taker_outcomes: HashMap<String, usize> = HashMap::new();
    for (key, stale_ok, taker_ok, payload) in outcomes {
        *taker_outcomes
            .entry(format!("stale {stale_ok} taker {taker_ok:?}"))
            .or_default() += 1;
        let rows = rows.get(&key).cloned().unwrap_or_default();
        let recorded = String::from_utf8(payload).unwrap();
        // The key's one row is the recorded owner's: anything else is a
        // stale owner's write landing beside or instead of the newer one.
        if rows != vec![recorded.clone()] || (stale_ok && taker_ok == Some(true)) {
            stale_commits += 1;
        }
        match recorded.as_str() {
            "stale" => stale_won += 1,
            _ => taker_won += 1,
        }
    }
    println!("{taker_outcomes:?}");
    println!("{n} races: stale owner completed first {stale_won}, taker-over won {taker_won}, stale commits {stale_commits}");
    assert_eq!(stale_commits, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stale_owners_racing_takers_over_never_commit() {
    let Some(url) = postgres_url() else { return };
    let (store, table, charges) = pg_fixture(&url).await;
    let idem = Idempotent::new(store.clone()).with_lease(Duration::from_millis(5));
    let rows = {
        let (store, charges) = (store.clone(), charges.clone());
        move || {
            let (store, charges) = (store.clone(), charges.clone());
            std::thread::spawn(move || {
                tokio::runtime::Runtime::new()
                    .unwrap()
                    .block_on(pg_rows(&store, &charges))
            })
            .join()
            .unwrap()
        }
    };
    races(
        Arc::new(Sql::Postgres(store.clone())),
        idem,
        charges.clone(),
        rows,
    )
    .await;
    pg_drop(&store, &table, &charges).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_stale_owners_racing_takers_over_never_commit() {
    let Some(url) = mysql_url() else { return };
    let (store, table, charges) = my_fixture(&url).await;
    let idem = Idempotent::new(store.clone()).with_lease(Duration::from_millis(5));
    let rows = {
        let (store, charges) = (store.clone(), charges.clone());
        move || {
            let (store, charges) = (store.clone(), charges.clone());
            std::thread::spawn(move || {
                tokio::runtime::Runtime::new()
                    .unwrap()
                    .block_on(my_rows(&store, &charges))
            })
            .join()
            .unwrap()
        }
    };
    races(
        Arc::new(Sql::Maria(store.clone())),
        idem,
        charges.clone(),
        rows,
    )
    .await;
    my_drop(&store, &table, &charges).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_stale_owners_racing_takers_over_never_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("races.db");
    let store = SqliteStore::open(&path).await.unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE charges (key TEXT NOT NULL, nonce TEXT NOT NULL)")
        .unwrap();
    let idem = Idempotent::new(store.clone()).with_lease(Duration::from_millis(5));
    races(
        Arc::new(Sql::Sqlite(store)),
        idem,
        "charges".to_owned(),
        || sqlite_rows(&path, "charges"),
    )
    .await;
}
