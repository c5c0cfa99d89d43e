//! The payments API with its charges in the store's database: a storm
//! against a server killed with SIGKILL and restarted, checked against the
//! ledger read back from the database, and a ledger that outlives a
//! restart.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use idem_demo::{RunningServer, StoreSpec};

/// How many times the short chaos run kills the server (`IDEM_CHAOS_KILLS`
/// raises it).
fn kills() -> String {
    std::env::var("IDEM_CHAOS_KILLS").unwrap_or_else(|_| "3".to_owned())
}

fn chaos(store: Option<&str>) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem-demo"));
    command
        .args([
            "storm",
            "--chaos",
            &kills(),
            "--clients",
            "8",
            "--payments",
            "400",
        ])
        .args(["--give-up-after-secs", "30", "--quiet"]);
    if let Some(store) = store {
        command.args(["--store", store]);
    }
    let output = command.output().expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}\n{stderr}");
    (output.status.success(), stdout)
}

fn killed(stdout: &str) -> usize {
    stdout
        .split("killed with SIGKILL ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the chaos line")
}

#[test]
fn a_storm_over_sqlite_survives_kill_9_with_every_payment_charged_once() {
    let (passed, stdout) = chaos(None);
    assert!(passed, "{stdout}");
    assert!(
        stdout.contains("charged twice                      0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("missing                            0"),
        "{stdout}"
    );
    assert!(
        killed(&stdout) >= 1,
        "the server was never killed\n{stdout}"
    );
}

#[test]
fn a_storm_over_postgres_survives_kill_9_with_every_payment_charged_once() {
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned());
    if std::net::TcpStream::connect(("127.0.0.1", 5432)).is_err()
        && std::env::var("IDEM_POSTGRES_URL").is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "{url} unreachable and CI is set"
        );
        eprintln!("skipping: {url} is not reachable");
        return;
    }
    let (passed, stdout) = chaos(Some(&url));
    assert!(passed, "{stdout}");
    assert!(
        killed(&stdout) >= 1,
        "the server was never killed\n{stdout}"
    );
}

#[test]
fn a_storm_over_mariadb_survives_kill_9_with_every_payment_charged_once() {
    let url = std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    if std::net::TcpStream::connect(("127.0.0.1", 3306)).is_err()
        && std::env::var("IDEM_MYSQL_URL").is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "{url} unreachable and CI is set"
        );
        eprintln!("skipping: {url} is not reachable");
        return;
    }
    let (passed, stdout) = chaos(Some(&url));
    assert!(passed, "{stdout}");
    assert!(
        stdout.contains("charged twice                      0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("missing                            0"),
        "{stdout}"
    );
    assert!(
        killed(&stdout) >= 1,
        "the server was never killed\n{stdout}"
    );
}

/// Regression guard for the in-memory ledger: a stopped and restarted
/// server lists the charges it made before, and a retry replays one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_outlives_a_restart_and_a_retry_replays() {
    let dir = tempfile::tempdir().unwrap();
    let spec = StoreSpec::sqlite(dir.path().join("ledger.db"));
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let start = || async {
        let book = spec
            .open_book()
            .await
            .unwrap()
            .expect("SQLite keeps a book");
        RunningServer::start_in_db(addr, book, Duration::from_secs(60), Duration::ZERO)
            .await
            .unwrap()
    };
    let pay = |url: String| async move {
        let client = reqwest::Client::new();
        client
            .post(format!("{url}/payments"))
            .header("Idempotency-Key", "order-7f3a")
            .header("Content-Type", "application/json")
            .body(r#"{"amount": 1250, "currency": "EUR"}"#)
            .send()
            .await
            .unwrap()
    };
    let list = |url: String| async move {
        let body: serde_json::Value = reqwest::get(format!("{url}/payments"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["charges"].as_array().unwrap().clone()
    };
    let server = start().await;
    let first = pay(server.url()).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let charge: serde_json::Value = first.json().await.unwrap();
    server.stop().await.unwrap();

    let server = start().await;
    assert_eq!(list(server.url()).await, vec![charge.clone()]);
    let retry = pay(server.url()).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<serde_json::Value>().await.unwrap(), charge);
    assert_eq!(list(server.url()).await.len(), 1);
    server.stop().await.unwrap();
}
