//! A primary killed with SIGKILL in the middle of a storm of calls and its
//! streaming standby promoted. With the standby named in
//! `synchronous_standby_names` no key runs twice under its live lease and
//! every outcome a caller was told replays after the failover; with
//! asynchronous replication the same storm loses told outcomes, and its
//! figures are printed.
//!
//! The servers are this test's own, on free ports, run as the `postgres`
//! user when the test runs as root: a primary from `initdb`, a standby from
//! `pg_basebackup`. The standby streams from the primary through a relay
//! the test holds; before the kill the relay stops passing the primary's
//! stream, so the standby is promoted without the primary's last writes,
//! the lag replication can always have. The store reaches the primary
//! through a second relay, which the test points at the standby once it is
//! promoted (what a virtual address or a proxy does for an application).
//! Without synchronous replication the writes in the lag are told and then
//! lost (asserted, so the storm is shown to catch the hole); with it they
//! wait for the standby, and no caller is told of them. `fsync` is off on
//! both servers: a killed process loses nothing the kernel holds.
//! `IDEM_FAILOVER_TRIALS` (default 1) sets the storms per mode.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idem_core::Idempotent;
use idem_postgres::sqlx::postgres::{PgPool, PgPoolOptions};
use idem_postgres::sqlx::{self, Connection, PgConnection};
use idem_postgres::PostgresStore;
use idem_testing::process::{free_port, Process};
use idem_testing::relay::Relay;
use idem_testing::storm::{Figures, Storm};

/// The directory of the server's programs, or why there is none.
fn bin_dir() -> Result<PathBuf, String> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("no PostgreSQL programs in /usr/lib/postgresql: {e}"))?
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| bin.join("postgres").exists() && bin.join("pg_basebackup").exists())
        .collect();
    found.sort();
    found
        .pop()
        .ok_or_else(|| "no postgres and pg_basebackup under /usr/lib/postgresql".to_owned())
}

/// Who runs the servers: the `postgres` user's ids when this test runs as
/// root (the server refuses root), or nobody else.
fn server_user() -> Option<(u32, u32)> {
    let me = std::fs::read_to_string("/proc/self/status").ok()?;
    let root = me
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"));
    if !root {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let line = passwd.lines().find(|line| line.starts_with("postgres:"))?;
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
}

struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    user: Option<(u32, u32)>,
}

impl Cluster {
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command.stdin(Stdio::null());
        command
    }

    fn run(&self, program: &str, args: &[&str]) {
        let output = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} starts: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Appends `lines` to the file `name` of the data directory `data`.
    fn configure(&self, data: &str, name: &str, lines: &str) {
        let mut file = OpenOptions::new()
            .append(true)
            .open(self.path(data).join(name))
            .unwrap();
        file.write_all(lines.as_bytes()).unwrap();
    }

    /// The server on the data directory `data`, its log beside it.
    fn start(&self, data: &str, port: u16) -> Process {
        let log = std::fs::File::create(self.path(&format!("{data}.log"))).unwrap();
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.path(data))
            .args(["-c", &format!("port={port}")])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("postgres starts");
        Process::from(child)
    }

    fn log(&self, data: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{data}.log"))).unwrap_or_default()
    }
}

fn url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// One connection to the server on `port`, once it takes connections.
async fn connection(port: u16) -> PgConnection {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        match PgConnection::connect(&url(port)).await {
            Ok(connection) => return connection,
            Err(e) => assert!(Instant::now() < give_up, "port {port}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `query` (one integer out) on `connection` until it answers at
/// least `at_least`, or panics with `what` after 30 s.
async fn until(connection: &mut PgConnection, query: &str, at_least: i64, what: &str) {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let got: Result<i64, _> = sqlx::query_scalar(query).fetch_one(&mut *connection).await;
        if got.as_ref().is_ok_and(|got| *got >= at_least) {
            return;
        }
        assert!(Instant::now() < give_up, "{what}: last answer {got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn storm(synchronous: bool) -> Option<Figures> {
    let bin = match bin_dir() {
        Ok(bin) => bin,
        Err(reason) => return idem_testing::skip(&reason),
    };
    let cluster = Cluster {
        dir: tempfile::tempdir().unwrap(),
        bin,
        user: server_user(),
    };
    if let Some((uid, gid)) = cluster.user {
        std::os::unix::fs::chown(cluster.dir.path(), Some(uid), Some(gid)).unwrap();
    }
    let (primary_port, standby_port) = (free_port(), free_port());
    let primary_dir = cluster.path("primary");
    cluster.run(
        "initdb",
        &[
            "-D",
            primary_dir.to_str().unwrap(),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        ],
    );
    let sockets = cluster.dir.path().display().to_string();
    let names = if synchronous { "standby" } else { "" };
    cluster.configure(
        "primary",
        "postgresql.conf",
        &format!(
            "listen_addresses = '127.0.0.1'\nunix_socket_directories = '{sockets}'\n\
             fsync = off\nshared_buffers = 16MB\nmax_connections = 30\n\
             wal_level = replica\nmax_wal_senders = 4\nsynchronous_commit = on\n\
             synchronous_standby_names = '{names}'\n"
        ),
    );
    let mut primary = Some(cluster.start("primary", primary_port));
    let mut on_primary = connection(primary_port).await;

    let standby_dir = cluster.path("standby");
    cluster.run(
        "pg_basebackup",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &primary_port.to_string(),
            "-U",
            "postgres",
            "-D",
            standby_dir.to_str().unwrap(),
            "-X",
            "stream",
            "-c",
            "fast",
        ],
    );
    let stream = Relay::start(primary_port).await;
    // The standby, once promoted, stands alone: it waits for nobody.
    cluster.configure(
        "standby",
        "postgresql.conf",
        &format!(
            "synchronous_standby_names = ''\n\
             wal_retrieve_retry_interval = 50ms\n\
             primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name=standby'\n",
            stream.port()
        ),
    );
    std::fs::write(standby_dir.join("standby.signal"), "").unwrap();
    if let Some((uid, gid)) = cluster.user {
        std::os::unix::fs::chown(standby_dir.join("standby.signal"), Some(uid), Some(gid)).unwrap();
    }
    let _standby = cluster.start("standby", standby_port);
    let mut on_standby = connection(standby_port).await;
    until(
        &mut on_primary,
        "SELECT count(*) FROM pg_stat_replication \
         WHERE application_name = 'standby' AND state = 'streaming'",
        1,
        "the standby streams",
    )
    .await;

    let front = Relay::start(primary_port).await;
    let pool: PgPool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url(front.port()))
        .await
        .expect("the store's pool connects");
    let store = PostgresStore::from_pool(pool);
    store.migrate().await.expect("migrate");
    // The table reaches the standby before the lag begins.
    let migrated: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut on_primary)
        .await
        .unwrap();
    until(
        &mut on_primary,
        &format!(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE replay_lsn >= '{migrated}'::pg_lsn"
        ),
        1,
        "the standby replays the migration",
    )
    .await;

    // Every second run in this storm is one under a live lease.
    let idem = Idempotent::new(store).with_lease(Duration::from_secs(120));
    let storm = Storm::start(&idem, 8);
    tokio::task::block_in_place(|| {
        storm.wait(Storm::told, 300, "no calls completed before the lag");
    });
    stream.stall();
    if synchronous {
        // The commits wait for the standby, so nobody is told of them.
        until(
            &mut on_primary,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
            4,
            "no commit waits for the standby",
        )
        .await;
    } else {
        tokio::task::block_in_place(|| {
            let before = storm.told();
            storm.wait(
                Storm::told,
                before + 50,
                "no calls completed during the lag",
            );
        });
    }
    // SIGKILL, and the stream the relay held back is gone with it.
    if let Some(primary) = primary.take() {
        primary.kill();
    }
    drop(on_primary);
    stream.cut();
    let promoted: bool = sqlx::query_scalar("SELECT pg_promote(true, 60)")
        .fetch_one(&mut on_standby)
        .await
        .unwrap_or_else(|e| panic!("promote: {e}\n{}", cluster.log("standby")));
    assert!(
        promoted,
        "the standby was not promoted\n{}",
        cluster.log("standby")
    );
    front.point_to(standby_port);
    front.cut();
    storm.fault_ended();
    tokio::task::block_in_place(|| {
        storm.wait(
            Storm::told_after_fault,
            300,
            "service did not resume after the failover",
        );
    });
    let figures = storm.finish().await;
    if figures.lost_outcomes > 0 || figures.second_runs > 0 {
        eprintln!("standby's log:\n{}", cluster.log("standby"));
    }
    Some(figures)
}

fn trials() -> usize {
    std::env::var("IDEM_FAILOVER_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// With the standby named in `synchronous_standby_names`, nothing runs
/// twice and every told outcome replays after the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_synchronous_standby_a_failover_runs_nothing_twice_and_loses_no_outcome() {
    for trial in 1..=trials() {
        let Some(figures) = storm(true).await else {
            return;
        };
        eprintln!("synchronous standby, trial {trial}: {figures:?}");
        assert!(figures.told > 600, "{figures:?}");
        assert_eq!(
            figures.second_runs, 0,
            "a key ran twice under its lease: {figures:?}"
        );
        assert_eq!(
            figures.lost_outcomes, 0,
            "a told outcome was lost: {figures:?}"
        );
        assert_eq!(figures.wrong_when, 0, "{figures:?}");
    }
}

/// With asynchronous replication the outcomes told during the lag are
/// gone after the failover: the documented risk, made certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_asynchronous_standby_a_failover_loses_told_outcomes() {
    for trial in 1..=trials() {
        let Some(figures) = storm(false).await else {
            return;
        };
        eprintln!("asynchronous standby, trial {trial}: {figures:?}");
        assert!(figures.told > 600, "{figures:?}");
        assert!(
            figures.lost_outcomes > 0,
            "the lag lost nothing: {figures:?}"
        );
        assert_eq!(figures.wrong_when, 0, "{figures:?}");
    }
}
