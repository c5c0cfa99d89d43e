//! `tls-bench`: what TLS costs. Redis and PostgreSQL, each one server
//! started here that takes plain TCP and TLS side by side, measured
//! through a store over each in interleaved rounds: first executions and
//! replays per second at 1 and 32 callers, and the time to open one
//! connection. Medians of the rounds; the ratio is TLS ÷ plain.
//!
//! `cargo run --release -p idem-bench --bin tls-bench -- --help`
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idem_bench::markdown;
use idem_core::Idempotent;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_postgres::sqlx::{ConnectOptions, Connection};
use idem_postgres::PostgresStore;
use idem_redis::RedisStore;
use idem_testing::postgres::PgCluster;
use idem_testing::process::server_ports;
use idem_testing::tls::{pg_tls_server, wait_for_port, Certs, ServerCert, Watched};

/// Starts a Redis (`--port` and `--tls-port`) and a PostgreSQL (`ssl =
/// on`, `pg_hba.conf` taking both) on free loopback ports, with a CA and
/// a server certificate for `localhost` made here. Clients verify the
/// chain and the name (`rediss://` with `cacert=`, `sslmode=verify-full`)
/// and present no certificate, as with most managed services.
#[derive(Debug, Parser)]
#[command(name = "tls-bench", version)]
struct Args {
    /// A short run: one round of 200 ms a row, 20 connects.
    #[arg(long)]
    quick: bool,

    /// Rounds per row, plain and TLS alternating; the median is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,

    /// Length of one round, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    duration_ms: u64,

    /// Concurrent callers, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    callers: Vec<usize>,

    /// Connections opened, plain and TLS alternating, for the connect time.
    #[arg(long, default_value_t = 200)]
    connects: usize,

    /// The stores, comma-separated: redis, postgres.
    #[arg(long, value_delimiter = ',', default_value = "redis,postgres")]
    stores: Vec<String>,

    /// Rewrite the `tls` section of this Markdown file (`BENCHMARKS.md`).
    #[arg(long)]
    markdown: Option<std::path::PathBuf>,
}

/// One store's figures: per callers, first executions and replays per
/// second, plain and over TLS; and the median connect time in ms.
#[derive(Debug, Default)]
struct Figures {
    rows: Vec<Row>,
    connect_ms: (f64, f64),
}

#[derive(Debug)]
struct Row {
    callers: usize,
    first: (f64, f64),
    replay: (f64, f64),
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Calls per second of `callers` callers for `duration`: first executions
/// on fresh keys, or replays of one key each.
async fn round(
    idem: &Idempotent,
    callers: usize,
    duration: Duration,
    replay: bool,
    tag: &str,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (idem, stop, done, tag) =
                (idem.clone(), stop.clone(), done.clone(), tag.to_owned());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = if replay {
                        format!("{tag}-{caller}")
                    } else {
                        n += 1;
                        format!("{tag}-{caller}-{n}")
                    };
                    let out: Result<u64, idem_core::Error> =
                        idem.execute(&key, "request", || async { Ok(1) }).await;
                    if out.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// The rows of `plain` against `tls`, rounds alternating.
async fn measure(args: &Args, plain: &Idempotent, tls: &Idempotent) -> Vec<Row> {
    let duration = Duration::from_millis(args.duration_ms);
    let mut rows = Vec::new();
    for &callers in &args.callers {
        let pair = |replay: bool| async move {
            let (mut p, mut t) = (Vec::new(), Vec::new());
            for rep in 0..args.reps.max(1) {
                let tag = format!("c{callers}-{replay}-{rep}-{}", std::process::id());
                // Which goes first alternates too: neither always runs on
                // a server the other has just warmed.
                if rep % 2 == 0 {
                    p.push(round(plain, callers, duration, replay, &format!("p{tag}")).await);
                    t.push(round(tls, callers, duration, replay, &format!("t{tag}")).await);
                } else {
                    t.push(round(tls, callers, duration, replay, &format!("t{tag}")).await);
                    p.push(round(plain, callers, duration, replay, &format!("p{tag}")).await);
                }
            }
            (median(&mut p), median(&mut t))
        };
        let first = pair(false).await;
        let replay = pair(true).await;
        rows.push(Row {
            callers,
            first,
            replay,
        });
    }
    rows
}

/// Median milliseconds to open a connection and get one reply, plain and
/// TLS alternating.
async fn connect_times<F, Fut>(connects: usize, mut open: F) -> Result<(f64, f64), String>
where
    F: FnMut(bool) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let (mut plain, mut tls) = (Vec::new(), Vec::new());
    for _ in 0..connects.max(1) {
        for over_tls in [false, true] {
            let started = Instant::now();
            open(over_tls).await?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            if over_tls { &mut tls } else { &mut plain }.push(ms);
        }
    }
    Ok((median(&mut plain), median(&mut tls)))
}

/// Redis with a plain and a TLS port.
async fn run_redis(args: &Args, dir: &Path, certs: &Certs) -> Result<Figures, String> {
    let ports = server_ports(2, 0);
    let (plain_port, tls_port) = (ports[0], ports[1]);
    let (cert, key) = certs.server(ServerCert::Good);
    let arg = |s: &str| std::ffi::OsString::from(s);
    let command = vec![
        arg("redis-server"),
        arg("--port"),
        arg(&plain_port.to_string()),
        arg("--tls-port"),
        arg(&tls_port.to_string()),
        arg("--bind"),
        arg("127.0.0.1"),
        arg("--save"),
        arg(""),
        arg("--appendonly"),
        arg("no"),
        arg("--dir"),
        dir.as_os_str().to_owned(),
        arg("--tls-cert-file"),
        cert.into_os_string(),
        arg("--tls-key-file"),
        key.into_os_string(),
        arg("--tls-ca-cert-file"),
        certs.path("ca.pem").into_os_string(),
        arg("--tls-auth-clients"),
        arg("no"),
    ];
    let _server = Watched::start(&command, None).map_err(|e| format!("redis-server: {e}"))?;
    for port in ports {
        if !wait_for_port(port, Duration::from_secs(10)) {
            return Err(format!("redis-server never listened on {port}"));
        }
    }
    let plain_url = format!("redis://127.0.0.1:{plain_port}");
    let tls_url = format!(
        "rediss://localhost:{tls_port}/?cacert={}",
        certs.path("ca.pem").display()
    );
    let info = |url: &str| idem_redis::connection_info(url).map_err(|e| e.to_string());
    let (plain_info, tls_info) = (info(&plain_url)?, info(&tls_url)?);
    let connect_ms = connect_times(args.connects, |over_tls| {
        let info = if over_tls { &tls_info } else { &plain_info }.clone();
        async move {
            let client = redis::Client::open(info).map_err(|e| e.to_string())?;
            let mut connection = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?;
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        }
    })
    .await?;
    let store = |info: redis::ConnectionInfo| async move {
        RedisStore::connect(info)
            .await
            .map(Idempotent::new)
            .map_err(|e| e.to_string())
    };
    let plain = store(plain_info).await?;
    let tls = store(tls_info).await?;
    Ok(Figures {
        rows: measure(args, &plain, &tls).await,
        connect_ms,
    })
}

/// PostgreSQL with `ssl = on`, taking plain TCP and TLS.
async fn run_postgres(args: &Args, certs: &Certs) -> Result<Figures, String> {
    let cluster = PgCluster::new()?;
    let port = server_ports(1, 0)[0];
    let _server = pg_tls_server(&cluster, certs, ServerCert::Good, "data", port, false)?;
    let ca = certs.path("ca.pem").display().to_string();
    // The kit's server takes TLS with a client certificate only; this
    // one takes plain TCP beside TLS, without client certificates.
    let admin = format!(
        "postgres://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
        certs.path("client.pem").display(),
        certs.path("client.key").display()
    );
    std::fs::write(
        cluster.path("data").join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 trust\n",
    )
    .map_err(|e| format!("pg_hba.conf: {e}"))?;
    // The server listens before it takes connections ("starting up").
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut connection = loop {
        match idem_postgres::sqlx::PgConnection::connect(&admin).await {
            Ok(connection) => break connection,
            Err(error) if Instant::now() > give_up => return Err(format!("{admin}: {error}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    idem_postgres::sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut connection)
        .await
        .map_err(|e| e.to_string())?;
    connection.close().await.map_err(|e| e.to_string())?;
    // The reload is asynchronous: wait until a plain connection is taken.
    let plain_url = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable");
    let tls_url = format!(
        "postgres://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"
    );
    let options = |url: &str| PgConnectOptions::from_str(url).map_err(|e| e.to_string());
    let (plain_options, tls_options) = (options(&plain_url)?, options(&tls_url)?);
    let give_up = Instant::now() + Duration::from_secs(10);
    while plain_options.connect().await.is_err() {
        if Instant::now() > give_up {
            return Err("the server never took a plain connection".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connect_ms = connect_times(args.connects, |over_tls| {
        let options = if over_tls {
            &tls_options
        } else {
            &plain_options
        }
        .clone();
        async move {
            let mut connection = options.connect().await.map_err(|e| e.to_string())?;
            idem_postgres::sqlx::query("SELECT 1")
                .execute(&mut connection)
                .await
                .map_err(|e| e.to_string())?;
            connection.close().await.map_err(|e| e.to_string())
        }
    })
    .await?;
    let store = |options: PgConnectOptions| async move {
        // Two pools of 16 stay under the server's connection limit, and
        // every caller of 32 finds a connection half the time either way.
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(|e| e.to_string())?;
        let store = PostgresStore::from_pool(pool);
        store.migrate().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(Idempotent::new(store))
    };
    let plain = store(plain_options).await?;
    let tls = store(tls_options).await?;
    Ok(Figures {
        rows: measure(args, &plain, &tls).await,
        connect_ms,
    })
}

/// Two lines for `BENCHMARKS.md`, which has room for no more: each
/// store's ratios at each number of callers and its connect times.
fn summary(results: &[(String, Figures)]) -> String {
    let callers = |figures: &Figures| {
        let list: Vec<String> = figures.rows.iter().map(|r| r.callers.to_string()).collect();
        list.join(" / ")
    };
    let ratios = |figures: &Figures, pick: fn(&Row) -> (f64, f64)| {
        let list: Vec<String> = figures
            .rows
            .iter()
            .map(|r| format!("{:.2}", ratio(pick(r))))
            .collect();
        list.join(" / ")
    };
    let stores: Vec<String> = results
        .iter()
        .map(|(store, figures)| {
            let name = match store.as_str() {
                "redis" => "Redis",
                "postgres" => "PostgreSQL",
                other => other,
            };
            format!(
                "{name} first executions {}, replays {} at {} callers, connect {:.1} → {:.1} ms",
                ratios(figures, |r| r.first),
                ratios(figures, |r| r.replay),
                callers(figures),
                figures.connect_ms.0,
                figures.connect_ms.1,
            )
        })
        .collect();
    format!(
        "**TLS ÷ plain TCP**, same servers (`tls-bench`, `dev/idem-bench/notes/2026-12-05-tls.md`):\n{}.\n",
        stores.join("; ")
    )
}

fn ratio(pair: (f64, f64)) -> f64 {
    pair.1 / pair.0.max(f64::MIN_POSITIVE)
}

/// The table: per store and callers, plain rates and TLS's ratio.
fn table(results: &[(String, Figures)]) -> String {
    let mut out = String::from(
        "| store | callers | first plain /s | first TLS ÷ plain | replay plain /s | replay TLS ÷ plain | connect ms plain → TLS |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (store, figures) in results {
        for row in &figures.rows {
            out.push_str(&format!(
                "| {store} | {} | {} | {:.2} | {} | {:.2} | {:.2} → {:.2} |\n",
                row.callers,
                markdown::thousands(row.first.0),
                ratio(row.first),
                markdown::thousands(row.replay.0),
                ratio(row.replay),
                figures.connect_ms.0,
                figures.connect_ms.1,
            ));
        }
    }
    out
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.quick {
        (args.reps, args.duration_ms, args.connects) = (1, 200, 20);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tls-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => {
            eprintln!("tls-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let certs = Certs::new(dir.path());
    let mut results = Vec::new();
    for store in &args.stores {
        let figures = match store.as_str() {
            "redis" => runtime.block_on(run_redis(&args, dir.path(), &certs)),
            "postgres" => runtime.block_on(run_postgres(&args, &certs)),
            other => Err(format!("no store {other:?}: redis or postgres")),
        };
        match figures {
            Ok(figures) => results.push((store.clone(), figures)),
            Err(error) => {
                eprintln!("tls-bench: {store}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    let table = table(&results);
    println!("{table}");
    for (store, figures) in &results {
        for row in &figures.rows {
            println!(
                "{store} {} callers: first {:.0} → {:.0} /s, replay {:.0} → {:.0} /s",
                row.callers, row.first.0, row.first.1, row.replay.0, row.replay.1
            );
        }
    }
    if let Some(path) = &args.markdown {
        if let Err(error) = markdown::rewrite(path, &[("tls", summary(&results))]) {
            eprintln!("tls-bench: {error}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
