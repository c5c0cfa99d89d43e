//! Stores that go away and come back under load: a Redis server restarted,
//! PostgreSQL connections terminated. Every call ends with its own key's
//! outcome or a typed `Store` error saying whether the work ran, and the
//! same store object works again afterwards without being rebuilt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Error, Idempotent, When};
use idem_faults::{postgres_url, unique_name};
use idem_testing::process::{free_port, redis_server, Process};

/// What a stream of calls under an outage saw.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    before_work: usize,
    after_work: usize,
    lost: usize,
    ok_after_outage: usize,
}

/// Runs `callers` loops of `execute` on fresh keys until `stop`, checking
/// every answer belongs to its own key.
async fn load(idem: Idempotent, stop: Arc<AtomicBool>, recovered: Arc<AtomicBool>) -> Tally {
    let callers: Vec<_> = (0..8)
        .map(|caller| {
            let (idem, stop, recovered) = (idem.clone(), stop.clone(), recovered.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let key = format!("c{caller}-{n}");
                    let out: Result<String, Error<String>> = tokio::time::timeout(
                        Duration::from_secs(10),
                        idem.execute(&key, &key, || async { Ok(format!("outcome of {key}")) }),
                    )
                    .await
                    .unwrap_or_else(|_| panic!("{key}: a call hung through the outage"));
                    match out {
                        Ok(value) => {
                            assert_eq!(value, format!("outcome of {key}"), "another key's outcome");
                            tally.ok += 1;
                            if recovered.load(Ordering::SeqCst) {
                                tally.ok_after_outage += 1;
                            }
                        }
                        Err(Error::Store {
                            when: When::BeforeWork,
                            ..
                        }) => tally.before_work += 1,
                        Err(Error::Store {
                            when: When::AfterWork,
                            ..
                        }) => tally.after_work += 1,
                        // A server restarted without persistence forgets a
                        // claim made before it went down: the owner is told
                        // its outcome was not recorded.
                        Err(Error::LeaseLost) => tally.lost += 1,
                        Err(other) => panic!("{key}: unexpected answer during an outage: {other}"),
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for caller in callers {
        let t = caller.await.unwrap();
        total.ok += t.ok;
        total.before_work += t.before_work;
        total.after_work += t.after_work;
        total.lost += t.lost;
        total.ok_after_outage += t.ok_after_outage;
    }
    total
}

fn start_redis(port: u16, dir: &std::path::Path) -> Option<Process> {
    match redis_server(dir, port, &[]) {
        Ok(server) => {
            for _ in 0..200 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(server);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("redis-server did not start on port {port}");
        }
        Err(e) if std::env::var_os("CI").is_some() => panic!("redis-server cannot start: {e}"),
        Err(e) => {
            eprintln!("skipping: redis-server cannot start: {e}");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_under_load_gives_typed_errors_then_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let Some(server) = start_redis(port, dir.path()) else {
        return;
    };
    let url = format!("redis://127.0.0.1:{port}");
    let store = idem_redis::RedisStore::connect(url.as_str()).await.unwrap();
    let idem = Idempotent::new(store);
    let (stop, recovered) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let calls = tokio::spawn(load(idem.clone(), stop.clone(), recovered.clone()));

    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let server = start_redis(port, dir.path()).expect("redis-server restarts");
    recovered.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::SeqCst);
    let tally = calls.await.unwrap();
    println!("redis restart: {tally:?}");
    server.kill();

    assert!(
        tally.before_work + tally.after_work + tally.lost > 0,
        "the outage was never felt: {tally:?}"
    );
    assert!(
        tally.ok_after_outage > 0,
        "the store did not reconnect: {tally:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_terminated_under_load_give_typed_errors_then_serve_again() {
    use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    let Some(url) = postgres_url() else { return };
    let app = unique_name("terminated");
    let options: PgConnectOptions = url.parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.application_name(&app))
        .await
        .unwrap();
    let table = unique_name("outage");
    let store = idem_postgres::PostgresStore::from_pool(pool)
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let admin = idem_postgres::sqlx::PgPool::connect(&url).await.unwrap();
    let idem = Idempotent::new(store);
    let (stop, recovered) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let calls = tokio::spawn(load(idem.clone(), stop.clone(), recovered.clone()));

    let mut terminated = 0i64;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n: i64 = idem_postgres::sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&app)
        .fetch_one(&admin)
        .await
        .unwrap();
        terminated += n;
    }
    recovered.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    let tally = calls.await.unwrap();
    println!("postgres terminations ({terminated} backends): {tally:?}");
    idem_postgres::sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(&admin)
        .await
        .unwrap();

    // Whether a caller feels a termination depends on whether it was
    // mid-statement; what must hold is that nobody hung, nobody got another
    // key's outcome, and the pool recovered by itself.
    assert!(terminated > 0, "no connection was terminated");
    assert!(
        tally.ok_after_outage > 0,
        "the pool did not recover: {tally:?}"
    );
}
