//! Retry storms against an in-process payments API: every intended payment
//! must be charged exactly once.

use std::sync::Arc;
use std::time::Duration;

use idem_core::Store;
use idem_demo::{storm_in_process, Report, StormConfig};
use idem_sqlite::SqliteStore;

/// A storm small enough for a test run, with a fixed seed so that its plans
/// (races, drops, retries, altered bodies) are the same every time.
fn small_storm() -> StormConfig {
    let mut config = StormConfig::default();
    config.clients = 8;
    config.payments = 60;
    config.seed = 7;
    // A payment stuck longer than this is a bug to report, not to wait out.
    config.give_up_after = Duration::from_secs(10);
    config
}

async fn storm(store: Arc<dyn Store>) -> Report {
    let report = storm_in_process(store, &small_storm())
        .await
        .expect("the storm runs");
    println!("{report}");
    report
}

fn assert_exactly_once(report: &Report) {
    assert_eq!(report.double_charged, 0, "payments charged twice\n{report}");
    assert_eq!(report.missing, 0, "payments never charged\n{report}");
    assert_eq!(report.wrong, 0, "wrong charges or answers\n{report}");
    assert_eq!(report.charged, report.intended, "{report}");
    assert!(report.passed());
    // The storm must have pressed: without retries, races and altered
    // bodies it would prove nothing.
    assert!(report.replays > 0, "no replay seen\n{report}");
    assert!(report.mismatches > 0, "no altered body sent\n{report}");
    assert!(report.requests > 2 * report.intended as u64, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_over_sqlite_charges_every_payment_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("storm.db"))
        .await
        .unwrap();
    assert_exactly_once(&storm(Arc::new(store)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_over_the_memory_store_charges_every_payment_exactly_once() {
    assert_exactly_once(&storm(Arc::new(idem_core::MemoryStore::new())).await);
}

#[test]
fn the_storm_command_exits_zero_when_exactly_once_holds() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idem-demo"))
        .args(["storm", "--clients", "4", "--payments", "30", "--seed", "3"])
        .args(["--give-up-after-secs", "10"])
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "storm failed: {:?}\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("charges intended"), "{stdout}");
    assert!(stdout.contains("exactly once"), "{stdout}");
}

/// The server at `url` from `var`, or `None` with a printed reason; a
/// missing server fails instead when `CI` is set.
fn server(var: &str, default: &str, port: u16) -> Option<String> {
    let url = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() || std::env::var(var).is_ok() {
        return Some(url);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{url} is not reachable and CI is set"
    );
    eprintln!("skipping: {url} is not reachable");
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_over_redis_charges_every_payment_exactly_once() {
    let Some(url) = server("IDEM_REDIS_URL", "redis://127.0.0.1:6379", 6379) else {
        return;
    };
    let prefix = format!("idem-demo-test:{:016x}:", rand::random::<u64>());
    let store = idem_redis::RedisStore::connect(url.as_str())
        .await
        .unwrap()
        .with_prefix(prefix);
    assert_exactly_once(&storm(Arc::new(store)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_over_postgres_charges_every_payment_exactly_once() {
    let Some(url) = server(
        "IDEM_POSTGRES_URL",
        "postgres://root@127.0.0.1:5432/test",
        5432,
    ) else {
        return;
    };
    let table = format!("idem_demo_test_{:016x}", rand::random::<u64>());
    let store = idem_postgres::PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    let report = storm(Arc::new(store)).await;
    idem_postgres::sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
    assert_exactly_once(&report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_over_mariadb_charges_every_payment_exactly_once() {
    let Some(url) = server("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test", 3306) else {
        return;
    };
    let table = format!("idem_demo_test_{:016x}", rand::random::<u64>());
    let store = idem_mysql::MySqlStore::connect(&url)
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    let report = storm(Arc::new(store)).await;
    idem_mysql::sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
    assert_exactly_once(&report);
}
