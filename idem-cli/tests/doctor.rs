//! `idem doctor` run as a process against the real servers: a healthy
//! store passes, and each thing that can be wrong (the name, the port, the
//! CA, the host name, the password, the table, the memory policy, the
//! clock) is named in its own line, without the password.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use idem_testing::process::server_ports;
use idem_testing::tls::{redis_tls_server, wait_for_port, Certs, ServerCert, Watched};
use idem_testing::{unique_name, Cleanup, Server};

const SECRET: &str = "hunter2-sEcReT";

/// `idem doctor` with `args` and `env`: its exit code and its output.
fn doctor(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("doctor")
        .args(args)
        .env_remove("IDEM_STORE")
        .envs(env.iter().copied())
        .output()
        .expect("the idem binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("idem doctor {args:?}:\n{text}");
    assert!(!text.contains(SECRET), "the password shows: {text}");
    (output.status.code().unwrap_or(-1), text)
}

/// The line `level what …` of a report, or a panic showing the report.
fn line<'a>(text: &'a str, level: &str, what: &str) -> &'a str {
    text.lines()
        .find(|l| {
            let mut words = l.split_whitespace();
            words.next() == Some(level) && words.next() == Some(what)
        })
        .unwrap_or_else(|| panic!("no `{level} {what}` line in:\n{text}"))
}

/// A server's URL with a password put in after the user (`user:SECRET@`).
fn with_password(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a server URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}:{SECRET}@{host}")
}

#[tokio::test]
async fn a_migrated_postgres_table_passes_and_a_missing_one_is_named() {
    let Some(url) = Server::Postgres.require() else {
        return;
    };
    let table = unique_name("idem_doctor");
    let _guard = Cleanup::postgres(&url, format!("DROP TABLE IF EXISTS {table}"));
    let store = idem_postgres::PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let (code, text) = doctor(&[&url, "--table", &table], &[]);
    assert_eq!(code, 0, "{text}");
    for what in ["reach", "connect", "server", "table", "records", "clock"] {
        line(&text, "ok", what);
    }
    assert!(text.ends_with("no problems found\n"), "{text}");

    let missing = unique_name("idem_doctor_none");
    let (code, text) = doctor(&["--table", &missing], &[("IDEM_STORE", &url)]);
    assert_eq!(code, 1, "{text}");
    let problem = line(&text, "PROBLEM", "table");
    assert!(problem.contains("does not exist"), "{problem}");
    assert!(problem.contains("migrate()"), "{problem}");
}

#[tokio::test]
async fn a_migrated_mariadb_table_passes_and_a_wrong_password_is_a_login_problem() {
    let Some(url) = Server::MySql.require() else {
        return;
    };
    let table = unique_name("idem_doctor");
    let _guard = Cleanup::mysql(&url, format!("DROP TABLE IF EXISTS {table}"));
    let store = idem_mysql::MySqlStore::connect(&url)
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let (code, text) = doctor(&[&url, "--table", &table], &[]);
    assert_eq!(code, 0, "{text}");
    assert!(line(&text, "ok", "server").contains("MariaDB"), "{text}");
    for what in ["reach", "connect", "table", "records", "clock"] {
        line(&text, "ok", what);
    }

    let (code, text) = doctor(&[&with_password(&url, "idem_nobody")], &[]);
    assert_eq!(code, 1, "{text}");
    let problem = line(&text, "PROBLEM", "login");
    assert!(
        problem.contains("refused the user or password"),
        "{problem}"
    );
}

#[tokio::test]
async fn a_wrong_redis_password_is_a_login_problem_and_never_shown() {
    let Some(url) = Server::Redis.require() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store-url");
    std::fs::write(&file, with_password(&url, "idem_nobody")).unwrap();
    let (code, text) = doctor(&["--store-file", file.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{text}");
    line(&text, "PROBLEM", "login");
    assert!(line(&text, "ok", "store").contains(":***@"), "{text}");
}

#[test]
fn nothing_listening_and_a_name_that_does_not_resolve_are_named() {
    let (code, text) = doctor(&[&format!("postgres://app:{SECRET}@127.0.0.1:1/app")], &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        line(&text, "PROBLEM", "reach").contains("nothing listens"),
        "{text}"
    );

    let (code, text) = doctor(
        &[&format!("rediss://app:{SECRET}@idem-doctor.invalid:6380/")],
        &[],
    );
    assert_eq!(code, 1, "{text}");
    assert!(
        line(&text, "PROBLEM", "dns").contains("does not resolve"),
        "{text}"
    );

    let (code, text) = doctor(&["memcached://127.0.0.1:11211"], &[]);
    assert_eq!(code, 1, "{text}");
    line(&text, "PROBLEM", "url");
}

#[tokio::test]
async fn a_sqlite_file_passes_and_a_missing_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    drop(idem_sqlite::SqliteStore::open(&path).await.unwrap());
    let (code, text) = doctor(&[&format!("sqlite:{}", path.display())], &[]);
    assert_eq!(code, 0, "{text}");
    line(&text, "ok", "records");
    let missing = dir.path().join("none.db");
    let (code, text) = doctor(&[&format!("sqlite:{}", missing.display())], &[]);
    assert_eq!(code, 1, "{text}");
    line(&text, "PROBLEM", "file");
}

#[test]
fn no_store_or_two_stores_is_bad_usage() {
    assert_eq!(doctor(&[], &[]).0, 2);
    let (code, text) = doctor(
        &[
            "redis://127.0.0.1:6379/",
            "--store",
            "redis://127.0.0.1:6380/",
        ],
        &[],
    );
    assert_eq!(code, 2, "{text}");
}

/// A Redis with TLS only and client certificates required, and one that
/// may evict any key, shared by this binary's tests.
struct Redises {
    certs: Certs,
    tls: u16,
    evicting: u16,
    _watched: Vec<Watched>,
}

static REDISES: OnceLock<Option<Redises>> = OnceLock::new();

fn redises() -> Option<&'static Redises> {
    REDISES
        .get_or_init(|| {
            if which("redis-server").is_none() {
                return idem_testing::skip("no redis-server to start");
            }
            // The directory goes with the last watchdog.
            let dir = tempfile::tempdir().expect("a directory").keep();
            let certs = Certs::new(&dir);
            let ports = server_ports(2, 0);
            let tls = redis_tls_server(&dir, &certs, ServerCert::Good, ports[0])
                .expect("redis-server with TLS starts");
            let command: Vec<std::ffi::OsString> = [
                "redis-server",
                "--port",
                &ports[1].to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--maxmemory",
                "64mb",
                "--maxmemory-policy",
                "allkeys-lru",
            ]
            .iter()
            .map(Into::into)
            .collect();
            let mut command = command;
            command.extend(["--dir".into(), dir.clone().into_os_string()]);
            let evicting = Watched::start(&command, None).expect("redis-server starts");
            for port in &ports {
                assert!(
                    wait_for_port(*port, Duration::from_secs(10)),
                    "redis-server on {port} never listened"
                );
            }
            let remove = Watched::start(&["true".into()], Some(&dir)).expect("sh");
            Some(Redises {
                certs,
                tls: ports[0],
                evicting: ports[1],
                _watched: vec![tls, evicting, remove],
            })
        })
        .as_ref()
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

impl Redises {
    /// A `rediss://` URL to `host` trusting `ca`, with the client
    /// certificate and a password the server does not check.
    fn url(&self, host: &str, ca: &str) -> String {
        let file = |name: &str| self.certs.path(name).display().to_string();
        format!(
            "rediss://default:{SECRET}@{host}:{}/?cacert={}&cert={}&key={}",
            self.tls,
            file(ca),
            file("client.pem"),
            file("client.key")
        )
    }
}

#[test]
fn redis_over_verified_tls_passes() {
    let Some(redises) = redises() else { return };
    let url = redises.url("localhost", "ca.pem");
    let (code, text) = doctor(&[], &[("IDEM_STORE", &url)]);
    // A server without a password takes any from the default user.
    assert_eq!(code, 0, "{text}");
    assert!(line(&text, "ok", "connect").contains("over TLS"), "{text}");
    for what in ["reach", "server", "acl", "memory", "records", "clock"] {
        line(&text, "ok", what);
    }
}

#[test]
fn a_server_signed_by_another_ca_and_another_name_are_tls_problems() {
    let Some(redises) = redises() else { return };
    let (code, text) = doctor(
        &[],
        &[("IDEM_STORE", &redises.url("localhost", "other-ca.pem"))],
    );
    assert_eq!(code, 1, "{text}");
    let problem = line(&text, "PROBLEM", "tls");
    assert!(problem.contains("CA this host does not trust"), "{problem}");

    let (code, text) = doctor(&[], &[("IDEM_STORE", &redises.url("127.0.0.1", "ca.pem"))]);
    assert_eq!(code, 1, "{text}");
    let problem = line(&text, "PROBLEM", "tls");
    assert!(problem.contains("not for the name 127.0.0.1"), "{problem}");

    // A plain client on the TLS port.
    let url = format!("redis://127.0.0.1:{}/", redises.tls);
    let (code, text) = doctor(&[&url, "--timeout", "2"], &[]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("PROBLEM"), "{text}");
}

#[test]
fn a_redis_that_may_evict_records_is_a_problem() {
    let Some(redises) = redises() else { return };
    let url = format!("redis://127.0.0.1:{}/", redises.evicting);
    let (code, text) = doctor(&[&url], &[]);
    assert_eq!(code, 1, "{text}");
    let problem = line(&text, "PROBLEM", "memory");
    assert!(problem.contains("allkeys-lru"), "{problem}");
    assert!(problem.contains("noeviction"), "{problem}");
}

/// libfaketime, which the clock test installs from Debian's `faketime`.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[test]
fn a_clock_an_hour_off_is_a_warning() {
    let Some(url) = Server::Redis.require() else {
        return;
    };
    if !Path::new(LIBFAKETIME).exists() {
        idem_testing::skip::<()>(&format!("no {LIBFAKETIME} (apt-get install faketime)"));
        return;
    }
    // A prefix of its own: counting every record of the shared server
    // would only take time.
    let prefix = format!("{}:", unique_name("idem_doctor"));
    let (code, text) = doctor(
        &[&url, "--prefix", &prefix],
        &[
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", "+1h"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    assert_eq!(
        code, 0,
        "a skewed clock is a warning, not a problem: {text}"
    );
    let warning = line(&text, "warning", "clock");
    assert!(
        warning.contains("s behind this host's")
            && (warning.contains(" 3600.") || warning.contains(" 3599.")),
        "{warning}"
    );
}
