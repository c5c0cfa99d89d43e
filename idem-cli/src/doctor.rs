//! `idem doctor`: connects to a store as the library would and says, in
//! plain words, what is wrong.
//!
//! The checks run in order, and a failed step stops the ones that need it:
//! the host's name resolves, something answers on its port, the TLS
//! handshake and the login pass, the server is one idem supports and takes
//! writes, the records' table exists with idem's columns (SQL), the
//! maxmemory-policy keeps records and the ACL allows idem's commands
//! (Redis), and the server's clock agrees with this host's. Each line says
//! `ok`, `warning` or `PROBLEM`; the exit status is 1 when any problem was
//! found. Nothing is written but a trivial script in Redis's script cache
//! and a message to a channel nobody hears; the password never shows.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use idem_core::inspect::Inspect;

/// The arguments of `idem doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// The store URL; else `--store`, `--store-file` or `IDEM_STORE` (which
    /// keep a password out of the process list).
    url: Option<String>,
    /// How long each step may take, in seconds.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
}

/// Where the store's records live, from the global options.
#[derive(Debug)]
pub(crate) struct Place {
    pub(crate) table: Option<String>,
    pub(crate) prefix: Option<String>,
}

/// Runs the checks on the URL given and prints what they find.
pub(crate) fn main(
    given: Result<Option<String>, String>,
    place: Place,
    args: DoctorArgs,
) -> ExitCode {
    let url = match (args.url, given) {
        (Some(_), Ok(Some(_))) => {
            eprintln!("idem doctor: give the store once: as an argument, or by --store, --store-file or IDEM_STORE");
            return ExitCode::from(2);
        }
        (Some(url), _) | (None, Ok(Some(url))) => url,
        (None, Ok(None)) => {
            eprintln!(
                "idem doctor: no store given: pass a URL, --store-file PATH or set IDEM_STORE"
            );
            return ExitCode::from(2);
        }
        (None, Err(error)) => {
            eprintln!("idem doctor: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem doctor: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut report = Report::new(&url);
    report.line(Level::Ok, "store", crate::open::redact(&url));
    let step = Duration::from_secs(args.timeout.max(1));
    runtime.block_on(examine(&url, &place, step, &mut report));
    match report.problems {
        0 => {
            println!("no problems found");
            ExitCode::SUCCESS
        }
        n => {
            println!("{n} problem(s) found");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    Warning,
    Problem,
}

/// The lines printed so far, and the strings that must never show.
struct Report {
    problems: usize,
    secrets: Vec<String>,
}

impl Report {
    fn new(url: &str) -> Report {
        let secrets = password(url)
            .into_iter()
            .flat_map(|raw| [percent_decoded(&raw), raw])
            .filter(|secret| !secret.is_empty())
            .collect();
        Report {
            problems: 0,
            secrets,
        }
    }

    fn line(&mut self, level: Level, what: &str, text: impl std::fmt::Display) {
        let mut text = text.to_string();
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "***");
        }
        let label = match level {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Problem => {
                self.problems += 1;
                "PROBLEM"
            }
        };
        println!("{label:<8} {what:<9} {text}");
    }

    fn ok(&mut self, what: &str, text: impl std::fmt::Display) {
        self.line(Level::Ok, what, text);
    }

    fn warn(&mut self, what: &str, text: impl std::fmt::Display) {
        self.line(Level::Warning, what, text);
    }

    fn problem(&mut self, what: &str, text: impl std::fmt::Display) {
        self.line(Level::Problem, what, text);
    }
}

/// The URL's password, as written in it (percent-encoded or not).
fn password(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    Some(password.to_owned())
}

/// `%XX` escapes decoded, as the drivers read a password.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The store a URL names, by its scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Redis { tls: bool },
    Postgres,
    MySql,
}

fn kind(url: &str) -> Option<Kind> {
    match url.split(':').next().unwrap_or("") {
        "sqlite" => Some(Kind::Sqlite),
        "redis" => Some(Kind::Redis { tls: false }),
        "rediss" => Some(Kind::Redis { tls: true }),
        "postgres" | "postgresql" => Some(Kind::Postgres),
        "mysql" | "mariadb" => Some(Kind::MySql),
        _ => None,
    }
}

/// The host and port a server URL names, with the store's default port.
fn host_and_port(url: &str, kind: Kind) -> Option<(String, u16)> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let default = match kind {
        Kind::Redis { .. } => 6379,
        Kind::Postgres => 5432,
        Kind::MySql => 3306,
        Kind::Sqlite => return None,
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    let host = if host.is_empty() { "localhost" } else { host };
    let port = match port {
        Some(port) => port.parse().ok()?,
        None => default,
    };
    Some((host.to_owned(), port))
}

async fn examine(url: &str, place: &Place, step: Duration, report: &mut Report) {
    let Some(kind) = kind(url) else {
        report.problem(
            "url",
            "the URL's scheme is none idem knows: use sqlite:PATH, redis://, rediss://, postgres:// or mysql://",
        );
        return;
    };
    if kind == Kind::Sqlite {
        return sqlite(url, report).await;
    }
    let Some((host, port)) = host_and_port(url, kind) else {
        report.problem(
            "url",
            "the URL's host or port cannot be read (write scheme://user:password@host:port/…)",
        );
        return;
    };
    if !reach(&host, port, step, report).await {
        return;
    }
    match kind {
        Kind::Postgres => postgres(url, &host, place, step, report).await,
        Kind::MySql => mysql(url, &host, place, step, report).await,
        Kind::Redis { tls } => redis(url, &host, tls, place, step, report).await,
        Kind::Sqlite => {}
    }
}

/// Resolves the host and opens a TCP connection to its port.
async fn reach(host: &str, port: u16, step: Duration, report: &mut Report) -> bool {
    let target = (host.to_owned(), port);
    let resolved = tokio::task::spawn_blocking(move || {
        target
            .to_socket_addrs()
            .map(|addrs| addrs.collect::<Vec<SocketAddr>>())
    })
    .await;
    let addrs = match resolved {
        Ok(Ok(addrs)) if !addrs.is_empty() => addrs,
        Ok(Ok(_)) => {
            report.problem("dns", format!("the name {host} resolves to no address"));
            return false;
        }
        Ok(Err(error)) => {
            report.problem(
                "dns",
                format!("the name {host} does not resolve ({error}): check its spelling and this host's DNS"),
            );
            return false;
        }
        Err(error) => {
            report.problem("dns", format!("the lookup of {host} failed: {error}"));
            return false;
        }
    };
    let tried = addrs.clone();
    let connected = tokio::task::spawn_blocking(move || {
        let mut errors = Vec::new();
        for addr in tried {
            let started = Instant::now();
            match TcpStream::connect_timeout(&addr, step) {
                Ok(_) => return Ok((addr, started.elapsed())),
                Err(error) => errors.push((addr, error)),
            }
        }
        Err(errors)
    })
    .await;
    match connected {
        Ok(Ok((addr, took))) => {
            report.ok(
                "reach",
                format!("{host}:{port} answers at {addr} ({} ms)", took.as_millis()),
            );
            true
        }
        Ok(Err(errors)) => {
            let refused = errors
                .iter()
                .all(|(_, e)| e.kind() == std::io::ErrorKind::ConnectionRefused);
            let timed_out = errors.iter().any(|(_, e)| {
                matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                )
            });
            let tried: Vec<String> = errors.iter().map(|(a, _)| a.to_string()).collect();
            let tried = tried.join(", ");
            if refused {
                report.problem(
                    "reach",
                    format!("nothing listens on {host}:{port} ({tried}: connection refused): is the server running, and on this port?"),
                );
            } else if timed_out {
                report.problem(
                    "reach",
                    format!("no answer from {host}:{port} ({tried}) within {} s: a firewall, a security group or a wrong address", step.as_secs()),
                );
            } else {
                let (_, first) = &errors[0];
                report.problem(
                    "reach",
                    format!("cannot open a connection to {host}:{port} ({tried}): {first}"),
                );
            }
            false
        }
        Err(error) => {
            report.problem("reach", format!("the connection attempt failed: {error}"));
            false
        }
    }
}

/// What a failed connection's error text means: the words that show it,
/// the line's name and the sentence. The first match wins; the `{host}`
/// in a sentence is the URL's host.
const CAUSES: &[(&[&str], &str, &str)] = &[
    (
        &["unknownissuer", "unknown issuer"],
        "tls",
        "the server's certificate is signed by a CA this host does not trust: name the \
         CA's file in the URL (PostgreSQL sslrootcert=, MariaDB ssl-ca=, Redis cacert=)",
    ),
    (
        &["not valid for name", "notvalidforname"],
        "tls",
        "the server's certificate is not for the name {host}: connect by a name the \
         certificate holds, or have one issued for {host}",
    ),
    (
        &["expired"],
        "tls",
        "the server's certificate has expired: the server needs a new one",
    ),
    (
        &["notvalidyet", "not valid yet"],
        "tls",
        "the server's certificate is not valid yet: check this host's clock",
    ),
    (
        &[
            "invalidcontenttype",
            "corrupt message",
            "wrong version number",
        ],
        "tls",
        "the server did not answer in TLS: this port may be a plain one or speak \
         another protocol",
    ),
    (
        &[
            "does not support tls",
            "does not support ssl",
            "ssl is not enabled",
        ],
        "tls",
        "the server offers no TLS on this port, and the URL asks for it",
    ),
    (
        &["no encryption", "insecure transport"],
        "tls",
        "the server takes only encrypted connections: add sslmode=verify-full \
         (PostgreSQL) or ssl-mode=VERIFY_IDENTITY (MariaDB) and the CA's file",
    ),
    (
        &[
            "password authentication failed",
            "access denied",
            "wrongpass",
            "invalid username-password",
            "authentication failed",
        ],
        "login",
        "the server refused the user or password in the URL",
    ),
    (
        &["pg_hba.conf"],
        "login",
        "the server's pg_hba.conf has no line for this user, database and host",
    ),
    (
        &["noauth", "authentication required"],
        "login",
        "the server needs a password: add user:password@ to the URL, or pass it in a \
         file with --store-file",
    ),
    (
        &["noperm"],
        "acl",
        "the ACL refuses the user a command idem needs",
    ),
    (
        &["does not exist", "unknown database"],
        "database",
        "the database named in the URL does not exist on this server",
    ),
    (
        &[
            "no such file",
            "os error 2",
            "cannot read",
            "could not read",
        ],
        "url",
        "a file the URL names (a CA, a certificate or a key) cannot be read",
    ),
    (
        &[
            "error with configuration",
            "invalid value",
            "unknown option",
        ],
        "url",
        "the URL holds an option or a value the driver does not take",
    ),
    (
        &["certificate", "handshake", "tls", "ssl"],
        "tls",
        "the TLS handshake failed",
    ),
    (
        &[
            "connection reset",
            "broken pipe",
            "unexpected eof",
            "unexpectedeof",
        ],
        "connect",
        "the server closed the connection during the handshake: it may take only TLS \
         on this port (rediss://, sslmode=verify-full), or want a client certificate",
    ),
];

/// Says, from a failed connection's error, what went wrong.
fn refused(error: &str, host: &str, report: &mut Report) {
    let lower = error.to_lowercase();
    let (what, why) = CAUSES
        .iter()
        .find(|(words, _, _)| words.iter().any(|w| lower.contains(w)))
        .map_or(("connect", "the connection failed"), |(_, what, why)| {
            (*what, *why)
        });
    let why = why.replace("{host}", host);
    report.problem(what, format!("{why} ({})", error.trim()));
}

/// Compares the server's clock (ms since the epoch, read between
/// `before` and `after` on this host) with this host's.
fn clock(server_ms: i64, before: SystemTime, after: SystemTime, report: &mut Report) {
    let ms = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    };
    let (before, after) = (ms(before), ms(after));
    let middle = before + (after - before) / 2;
    let skew = server_ms - middle;
    let slack = (after - before) / 2 + 1;
    let side = if skew > 0 { "ahead of" } else { "behind" };
    if skew.abs() > 1000 + slack {
        report.warn(
            "clock",
            format!(
                "the server's clock is {:.1} s {side} this host's: idem keeps leases and retention on the server's clock, so records are safe, but times this host prints (logs, the console) disagree by that much; check NTP on both",
                skew.abs() as f64 / 1000.0
            ),
        );
    } else {
        report.ok(
            "clock",
            format!(
                "the server's clock agrees with this host's (within {} ms)",
                skew.abs().max(slack)
            ),
        );
    }
}

/// Counts the records through the store, as `idem stats` does: proof that
/// the table (or prefix) holds what idem reads.
async fn records(store: &dyn Inspect, what: &str, step: Duration, report: &mut Report) {
    match tokio::time::timeout(step, store.stats()).await {
        Ok(Ok(stats)) => report.ok(
            "records",
            format!(
                "{what} holds {} in flight, {} completed, {} failed, {} expired",
                stats.in_flight + stats.lapsed,
                stats.completed,
                stats.failed,
                stats.expired
            ),
        ),
        Ok(Err(error)) => report.problem(
            "records",
            format!("{what} cannot be read as idem's records: {error}"),
        ),
        Err(_) => report.problem(
            "records",
            format!("counting {what} took longer than {} s", step.as_secs()),
        ),
    }
}

async fn sqlite(url: &str, report: &mut Report) {
    let path = url["sqlite:".len()..].trim_start_matches("//");
    if path.is_empty() || !std::path::Path::new(path).is_file() {
        report.problem(
            "file",
            format!("no SQLite database at {path:?}: the application creates it on first use; check the path"),
        );
        return;
    }
    match idem_sqlite::SqliteStore::open(path).await {
        Ok(store) => {
            report.ok("open", format!("{path} opens"));
            records(&store, "the file", Duration::from_secs(10), report).await;
        }
        Err(error) => report.problem(
            "open",
            format!("{path} does not open as idem's database: {error}"),
        ),
    }
}

async fn postgres(url: &str, host: &str, place: &Place, step: Duration, report: &mut Report) {
    use idem_postgres::sqlx;
    let options = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(step);
    let pool = match tokio::time::timeout(step, options.connect(url)).await {
        Ok(Ok(pool)) => pool,
        Ok(Err(error)) => return refused(&error.to_string(), host, report),
        Err(_) => {
            return report.problem(
                "connect",
                format!(
                    "no PostgreSQL handshake within {} s: is this port PostgreSQL's?",
                    step.as_secs()
                ),
            )
        }
    };
    let session: Result<(String, String, Option<String>, bool), sqlx::Error> = sqlx::query_as(
        "SELECT current_user::text, current_setting('server_version'), \
         (SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid()), pg_is_in_recovery()",
    )
    .fetch_one(&pool)
    .await;
    let (user, version, tls, standby) = match session {
        Ok(row) => row,
        Err(error) => {
            return report.problem(
                "server",
                format!("the server answers but not to a plain query: {error}"),
            )
        }
    };
    match tls {
        Some(tls) => report.ok("connect", format!("logged in as {user}, over {tls}")),
        None if loopback(host) => report.ok("connect", format!("logged in as {user}, without TLS (loopback)")),
        None => report.warn(
            "connect",
            format!("logged in as {user} WITHOUT TLS: the password and the records cross the network in clear; add sslmode=verify-full"),
        ),
    }
    report.ok("server", format!("PostgreSQL {version}"));
    if standby {
        report.problem("server", "this server is a standby (read-only): idem's writes fail; point the URL at the primary");
    }
    let store = match idem_postgres::PostgresStore::from_pool(pool.clone()).with_table(
        place
            .table
            .as_deref()
            .unwrap_or(idem_postgres::DEFAULT_TABLE),
    ) {
        Ok(store) => store,
        Err(error) => return report.problem("table", error),
    };
    let table = store.table();
    let found: Result<(bool, bool, String), sqlx::Error> = sqlx::query_as(
        "SELECT to_regclass($1) IS NOT NULL, \
         COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false), \
         COALESCE(current_schema(), '(none)')",
    )
    .bind(&table)
    .fetch_one(&pool)
    .await;
    match found {
        Ok((false, can_create, schema)) => {
            let create = if can_create {
                "this user may create it"
            } else {
                "and this user may not create tables in it: grant CREATE on the schema or create the table as its owner"
            };
            report.problem(
                "table",
                format!("the table {table} does not exist in schema {schema}: the application creates it with PostgresStore::migrate(); {create}"),
            );
        }
        Ok((true, _, _)) => {
            let rights: Result<bool, sqlx::Error> = sqlx::query_scalar(
                "SELECT has_table_privilege($1, 'SELECT, INSERT, UPDATE, DELETE')",
            )
            .bind(&table)
            .fetch_one(&pool)
            .await;
            match rights {
                Ok(true) => report.ok("table", format!("{table} exists; {user} may read and write it")),
                Ok(false) => report.problem(
                    "table",
                    format!("{user} may not read and write {table}: GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {user}"),
                ),
                Err(error) => report.warn("table", format!("the rights on {table} cannot be read: {error}")),
            }
            records(&store, &format!("the table {table}"), step, report).await;
        }
        Err(error) => report.warn("table", format!("the catalog cannot be read: {error}")),
    }
    let before = SystemTime::now();
    let now: Result<i64, sqlx::Error> =
        sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            .fetch_one(&pool)
            .await;
    match now {
        Ok(ms) => clock(ms, before, SystemTime::now(), report),
        Err(error) => report.warn(
            "clock",
            format!("the server's clock cannot be read: {error}"),
        ),
    }
}

fn loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

async fn mysql(url: &str, host: &str, place: &Place, step: Duration, report: &mut Report) {
    use idem_mysql::sqlx;
    let scheme = url.split(':').next().unwrap_or("");
    let url = format!("mysql:{}", &url[scheme.len() + 1..]);
    let options = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(step);
    let pool = match tokio::time::timeout(step, options.connect(&url)).await {
        Ok(Ok(pool)) => pool,
        Ok(Err(error)) => return refused(&error.to_string(), host, report),
        Err(_) => {
            return report.problem(
                "connect",
                format!(
                    "no MariaDB handshake within {} s: is this port MariaDB's?",
                    step.as_secs()
                ),
            )
        }
    };
    let session: Result<(String, String, i64), sqlx::Error> = sqlx::query_as(
        "SELECT CAST(CURRENT_USER() AS CHAR), CAST(VERSION() AS CHAR), CAST(@@read_only AS SIGNED)",
    )
    .fetch_one(&pool)
    .await;
    let (user, version, read_only) = match session {
        Ok(row) => row,
        Err(error) => {
            return report.problem(
                "server",
                format!("the server answers but not to a plain query: {error}"),
            )
        }
    };
    let tls: Option<(String, String)> = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_version'")
        .fetch_optional(&pool)
        .await
        .ok()
        .flatten();
    match tls.map(|(_, v)| v).filter(|v| !v.is_empty()) {
        Some(tls) => report.ok("connect", format!("logged in as {user}, over {tls}")),
        None if loopback(host) => report.ok("connect", format!("logged in as {user}, without TLS (loopback)")),
        None => report.warn(
            "connect",
            format!("logged in as {user} WITHOUT TLS: the password and the records cross the network in clear; add ssl-mode=VERIFY_IDENTITY"),
        ),
    }
    let mariadb = version.to_lowercase().contains("mariadb");
    let number: Vec<u32> = version
        .split(|c: char| !c.is_ascii_digit())
        .take(2)
        .filter_map(|n| n.parse().ok())
        .collect();
    if !mariadb {
        report.problem("server", format!("MySQL {version}: idem-mysql needs MariaDB 10.5 or later (INSERT … RETURNING); MySQL is not supported yet"));
    } else if number.as_slice() < [10, 5].as_slice() {
        report.problem(
            "server",
            format!("MariaDB {version}: idem-mysql needs 10.5 or later (INSERT … RETURNING)"),
        );
    } else {
        report.ok("server", format!("MariaDB {version}"));
    }
    if read_only != 0 {
        report.problem("server", "the server is read-only (@@read_only): idem's writes fail; point the URL at the primary");
    }
    let store = match idem_mysql::MySqlStore::from_pool(pool.clone())
        .with_table(place.table.as_deref().unwrap_or(idem_mysql::DEFAULT_TABLE))
    {
        Ok(store) => store,
        Err(error) => return report.problem("table", error),
    };
    let table = store.table();
    let bare = table.replace('`', "");
    let (schema, name) = match bare.split_once('.') {
        Some((schema, name)) => (Some(schema.to_owned()), name.to_owned()),
        None => (None, bare.clone()),
    };
    let found: Result<(i64, Option<String>), sqlx::Error> = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM information_schema.tables \
          WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?), \
         CAST(COALESCE(?, DATABASE()) AS CHAR)",
    )
    .bind(&schema)
    .bind(&name)
    .bind(&schema)
    .fetch_one(&pool)
    .await;
    match found {
        Ok((_, None)) => report.problem("table", "the URL names no database: add /DATABASE to its path"),
        Ok((0, Some(db))) => report.problem(
            "table",
            format!("the table {table} does not exist in database {db}: the application creates it with MySqlStore::migrate()"),
        ),
        Ok((_, Some(_))) => {
            report.ok("table", format!("{table} exists"));
            records(&store, &format!("the table {table}"), step, report).await;
        }
        Err(error) => report.warn("table", format!("the catalog cannot be read: {error}")),
    }
    let before = SystemTime::now();
    let now: Result<i64, sqlx::Error> =
        sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)")
            .fetch_one(&pool)
            .await;
    match now {
        Ok(ms) => clock(ms, before, SystemTime::now(), report),
        Err(error) => report.warn(
            "clock",
            format!("the server's clock cannot be read: {error}"),
        ),
    }
}

async fn redis(
    url: &str,
    host: &str,
    tls: bool,
    place: &Place,
    step: Duration,
    report: &mut Report,
) {
    use idem_redis::redis;
    let info = match idem_redis::connection_info(url) {
        Ok(info) => info,
        Err(error) => return report.problem("url", error),
    };
    let client = match redis::Client::open(info.clone()) {
        Ok(client) => client,
        Err(error) => return report.problem("url", error),
    };
    let connection = tokio::time::timeout(step, client.get_multiplexed_async_connection()).await;
    let mut connection = match connection {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => return refused(&error.to_string(), host, report),
        Err(_) => {
            return report.problem(
                "connect",
                format!("no Redis handshake within {} s: is this port Redis's, and is TLS (rediss://) right for it?", step.as_secs()),
            )
        }
    };
    // A PING proves the login: a server with a password refuses it
    // otherwise.
    if let Err(error) = redis::cmd("PING")
        .query_async::<String>(&mut connection)
        .await
    {
        return refused(&error.to_string(), host, report);
    }
    let user = info
        .redis_settings()
        .username()
        .unwrap_or("default")
        .to_owned();
    match (tls, loopback(host)) {
        (true, _) => report.ok("connect", format!("logged in as {user}, over TLS")),
        (false, true) => report.ok("connect", format!("logged in as {user}, without TLS (loopback)")),
        (false, false) => report.warn(
            "connect",
            format!("logged in as {user} WITHOUT TLS: the password and the records cross the network in clear; use rediss://"),
        ),
    }
    let server: Result<redis::InfoDict, _> = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut connection)
        .await;
    match server {
        Ok(info) => {
            let version: String = info.get("redis_version").unwrap_or_default();
            report.ok("server", format!("Redis {version}"));
        }
        Err(error) => report.warn(
            "server",
            format!("INFO is refused, so the version is unknown: {error}"),
        ),
    }
    let role: Result<redis::Value, _> = redis::cmd("ROLE").query_async(&mut connection).await;
    if let Ok(redis::Value::Array(items)) = &role {
        if let Some(redis::Value::BulkString(role)) = items.first() {
            if role.as_slice() == b"slave" {
                report.problem("server", "this server is a replica (read-only): idem's writes fail; point the URL at the master");
            }
        }
    }
    let prefix = place
        .prefix
        .as_deref()
        .unwrap_or(idem_redis::DEFAULT_PREFIX);
    // The commands the store sends, each tried in a form that changes
    // nothing: a script that returns 1, a WAIT for no replica, a message to
    // a channel nobody subscribes to.
    let mut refused_commands = Vec::new();
    let sha: Result<String, _> = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut connection)
        .await;
    let tries: Vec<(&str, redis::Cmd)> = {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(sha.as_deref().unwrap_or("0")).arg(0);
        let mut wait = redis::cmd("WAIT");
        wait.arg(0).arg(0);
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(format!("{prefix}doctor")).arg("");
        let mut scan = redis::cmd("SCAN");
        scan.arg(0)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1);
        vec![
            ("EVALSHA", evalsha),
            ("WAIT", wait),
            ("PUBLISH", publish),
            ("SCAN", scan),
        ]
    };
    if let Err(error) = &sha {
        if error.to_string().contains("NOPERM") {
            refused_commands.push("SCRIPT LOAD");
        }
    }
    for (name, command) in &tries {
        if let Err(error) = command.query_async::<redis::Value>(&mut connection).await {
            if error.to_string().to_uppercase().contains("NOPERM") {
                refused_commands.push(name);
            }
        }
    }
    if refused_commands.is_empty() {
        report.ok(
            "acl",
            format!("{user} may run SCRIPT LOAD, EVALSHA, WAIT, PUBLISH and SCAN"),
        );
    } else {
        report.problem(
            "acl",
            format!("the ACL refuses {user} {}: idem needs them (on keys {prefix}*); add them to the user's ACL", refused_commands.join(", ")),
        );
    }
    let memory: Result<redis::InfoDict, _> = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut connection)
        .await;
    let policy = match memory {
        Ok(memory) => memory.get::<String>("maxmemory_policy"),
        Err(error) => {
            report.warn(
                "memory",
                format!("the maxmemory-policy cannot be read (INFO memory): {error}"),
            );
            None
        }
    };
    let evicting = policy.as_deref().is_some_and(idem_redis::evicts_records);
    match policy {
        Some(policy) if evicting => {
            report.problem(
                "memory",
                format!(
                    "the maxmemory-policy is {policy}: when memory runs out Redis evicts \
                     records, and a retry then runs its work again, so the store refuses \
                     to claim; set maxmemory-policy to noeviction or a volatile-* policy"
                ),
            );
        }
        Some(policy) => report.ok(
            "memory",
            format!("the maxmemory-policy {policy} never evicts records"),
        ),
        None => {}
    }
    // The store refuses to open on an evicting server: its records go
    // uncounted.
    let opened = if evicting {
        None
    } else {
        Some(tokio::time::timeout(step, idem_redis::RedisStore::connect(info)).await)
    };
    match opened {
        None => {}
        Some(Ok(Ok(store))) => {
            let store = store.with_prefix(prefix);
            records(&store, &format!("the prefix {prefix}"), step, report).await;
        }
        Some(Ok(Err(error))) => {
            report.problem("store", format!("the store does not open: {error}"))
        }
        Some(Err(_)) => report.problem(
            "store",
            format!("the store did not open within {} s", step.as_secs()),
        ),
    }
    let before = SystemTime::now();
    let time: Result<(String, String), _> = redis::cmd("TIME").query_async(&mut connection).await;
    match time {
        Ok((secs, micros)) => {
            let ms =
                secs.parse::<i64>().unwrap_or(0) * 1000 + micros.parse::<i64>().unwrap_or(0) / 1000;
            clock(ms, before, SystemTime::now(), report);
        }
        Err(error) => report.warn(
            "clock",
            format!("the server's clock cannot be read (TIME): {error}"),
        ),
    }
}
