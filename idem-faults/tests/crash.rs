//! Worker processes killed with SIGKILL at random points, on each store:
//! while a lease is live no key runs twice, after it lapses exactly one
//! retry takes over, and every outcome a caller was told replays unchanged.
//!
//! `IDEM_CRASH_TRIALS` (default 1) and `IDEM_CRASH_SECS` (default 4) raise
//! the work done.

use std::path::Path;
use std::time::Duration;

use idem_faults::crash::{self, Trial};
use idem_faults::{mysql_url, postgres_url, redis_url, unique_name, Backend};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn trial() -> Trial {
    Trial {
        workers: 4,
        keys: 400,
        lease: Duration::from_millis(1000),
        duration: Duration::from_secs(env_number("IDEM_CRASH_SECS", 4)),
        self_kill_per_mille: 15,
        max_kill_gap: Duration::from_millis(300),
    }
}

async fn trials(backend: impl Fn(&Path) -> Backend) {
    let exe = Path::new(env!("CARGO_BIN_EXE_fault-worker"));
    for n in 0..env_number("IDEM_CRASH_TRIALS", 1) {
        let dir = tempfile::tempdir().unwrap();
        let backend = backend(dir.path());
        let outcome = crash::run(exe, &backend, &trial(), dir.path())
            .await
            .unwrap_or_else(|broken| panic!("{} trial {n}: {broken}", backend.name()));
        println!("{} trial {n}: {outcome:?}", backend.name());
        assert!(
            outcome.killed + outcome.self_killed > 0,
            "nothing was killed: {outcome:?}"
        );
        assert!(
            outcome.told > 0 && outcome.runs > 0,
            "no work was done: {outcome:?}"
        );
        assert_eq!(outcome.keys_completed, trial().keys as usize);
        cleanup(&backend).await;
    }
}

async fn cleanup(backend: &Backend) {
    match backend {
        Backend::Sqlite(_) => {}
        Backend::Redis { url, prefix } => {
            use idem_redis::redis::AsyncCommands;
            let client = idem_redis::redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let keys: Vec<Vec<u8>> = conn.keys(format!("{prefix}*")).await.unwrap();
            if !keys.is_empty() {
                let _: () = conn.del(keys).await.unwrap();
            }
        }
        Backend::Postgres { url, table } => {
            let pool = idem_postgres::sqlx::PgPool::connect(url).await.unwrap();
            idem_postgres::sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                .execute(&pool)
                .await
                .unwrap();
        }
        Backend::MySql { url, table } => {
            let pool = idem_mysql::sqlx::MySqlPool::connect(url).await.unwrap();
            idem_mysql::sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {table}"))
                .execute(&pool)
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_workers_killed_at_random_points() {
    trials(|dir| Backend::Sqlite(dir.join("idem.db"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_survives_workers_killed_at_random_points() {
    let Some(url) = redis_url() else { return };
    trials(|_| Backend::Redis {
        url: url.clone(),
        prefix: format!("{}:", unique_name("crash")),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_workers_killed_at_random_points() {
    let Some(url) = postgres_url() else { return };
    trials(|_| Backend::Postgres {
        url: url.clone(),
        table: unique_name("crash"),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_survives_workers_killed_at_random_points() {
    let Some(url) = mysql_url() else { return };
    trials(|_| Backend::MySql {
        url: url.clone(),
        table: unique_name("crash"),
    })
    .await;
}
