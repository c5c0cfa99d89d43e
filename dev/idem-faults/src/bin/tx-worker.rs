//! A worker process for the transactional crash trials: for each key it
//! claims the key, writes one business row and records the outcome in the
//! same transaction, and may kill itself with SIGKILL at one chosen point.
//!
//! Usage: `tx-worker POINT KEYS LEASE_MS CHARGES BACKEND...`, where POINT is
//! `none`, `before-claim`, `before-write`, `after-write`, `after-complete`
//! or `after-commit`, KEYS a comma-separated list and CHARGES the business
//! table. It prints `acked KEY VALUE ran|replayed` for every outcome it
//! would acknowledge to a client.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{BeginJson, Error, Idempotent};
use idem_faults::Backend;
use idem_mysql::MySqlStore;
use idem_postgres::PostgresStore;
use idem_sqlite::{Settle, SqliteStore};
use idem_testing::StoreKind;

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
    Maria(MySqlStore),
    Sqlite(SqliteStore),
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(point), Some(keys), Some(lease), Some(charges), Some(backend)) = (
        args.first().cloned(),
        args.get(1).cloned(),
        args.get(2).and_then(|l| l.parse::<u64>().ok()),
        args.get(3).cloned(),
        args.get(4..).and_then(Backend::from_args),
    ) else {
        eprintln!("usage: tx-worker POINT KEYS LEASE_MS CHARGES BACKEND...");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let sql = match backend.kind() {
            StoreKind::Postgres => {
                let store = PostgresStore::connect(backend.location())
                    .await
                    .and_then(|s| s.with_table(backend.scope()))
                    .expect("the store opens");
                Sql::Postgres(store)
            }
            StoreKind::Sqlite => Sql::Sqlite(
                SqliteStore::open(backend.location())
                    .await
                    .expect("the store opens"),
            ),
            StoreKind::MySql => {
                let store = MySqlStore::connect(backend.location())
                    .await
                    .and_then(|s| s.with_table(backend.scope()))
                    .expect("the store opens");
                Sql::Maria(store)
            }
            _ => {
                eprintln!("tx-worker: {backend:?} has no transactional completion yet");
                std::process::exit(2);
            }
        };
        let store: Arc<dyn idem_core::store::Store> = match &sql {
            Sql::Postgres(store) => Arc::new(store.clone()),
            Sql::Maria(store) => Arc::new(store.clone()),
            Sql::Sqlite(store) => Arc::new(store.clone()),
        };
        let idem = Idempotent::from_arc(store).with_lease(Duration::from_millis(lease));
        for key in keys.split(',') {
            run(&idem, &sql, &point, key, &charges).await;
        }
    });
}

async fn run(idem: &Idempotent, sql: &Sql, point: &str, key: &str, charges: &str) {
    let at = |here: &str| {
        if point == here {
            die();
        }
    };
    at("before-claim");
    let lease = loop {
        match idem
            .begin_json::<_, String, std::convert::Infallible>(key, key)
            .await
        {
            Ok(BeginJson::Run(lease)) => break lease,
            Ok(BeginJson::Replayed(value)) => return ack(key, &value, "replayed"),
            Err(Error::InProgress { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(error) => return println!("error {key} {error}"),
        }
    };
    let nonce = format!("{:016x}", rand::random::<u64>());
    let payload = serde_json::to_vec(&nonce).expect("a string encodes");
    match sql {
        Sql::Postgres(store) => {
            let mut tx = store.pool().begin().await.expect("a transaction");
            at("before-write");
            sqlx::query(&format!(
                "INSERT INTO {charges} (key, nonce) VALUES ($1, $2)"
            ))
            .bind(key)
            .bind(&nonce)
            .execute(&mut *tx)
            .await
            .expect("the business write");
            at("after-write");
            let done = match store.complete_in(&mut tx, lease, &payload).await {
                Ok(done) => done,
                Err(error) => return println!("error {key} {error}"),
            };
            at("after-complete");
            done.commit(tx.commit()).await.expect("the commit");
        }
        Sql::Maria(store) => {
            let mut tx = store.pool().begin().await.expect("a transaction");
            at("before-write");
            sqlx::query(&format!(
                "INSERT INTO {charges} (`key`, nonce) VALUES (?, ?)"
            ))
            .bind(key)
            .bind(&nonce)
            .execute(&mut *tx)
            .await
            .expect("the business write");
            at("after-write");
            let done = match store.complete_in(&mut tx, lease, &payload).await {
                Ok(done) => done,
                Err(error) => return println!("error {key} {error}"),
            };
            at("after-complete");
            done.commit(tx.commit()).await.expect("the commit");
        }
        Sql::Sqlite(store) => {
            let (step, key_owned, charges, nonce_row) = (
                point.to_owned(),
                key.to_owned(),
                charges.to_owned(),
                nonce.clone(),
            );
            let settled = store
                .settle_in_tx(&lease, move |conn| {
                    if step == "before-write" {
                        die();
                    }
                    conn.execute(
                        &format!("INSERT INTO {charges} (key, nonce) VALUES (?1, ?2)"),
                        [&key_owned, &nonce_row],
                    )
                    .expect("the business write");
                    if step == "after-write" {
                        die();
                    }
                    if step == "after-complete" {
                        // The completion and the commit follow on this
                        // thread at once: a kill sent now lands somewhere
                        // among the completion, the commit and its fsync.
                        std::thread::spawn(|| die());
                    }
                    Settle::Complete(payload)
                })
                .await;
            if let Err(error) = settled {
                return println!("error {key} {error}");
            }
            if point == "after-complete" {
                // The kill is on its way from another thread; a real crash
                // would not acknowledge either.
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
    at("after-commit");
    ack(key, &nonce, "ran");
}

fn ack(key: &str, value: &str, how: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "acked {key} {value} {how}");
    let _ = out.flush();
}
