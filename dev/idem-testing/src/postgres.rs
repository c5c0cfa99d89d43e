//! PostgreSQL servers a test or bench starts itself from the server's
//! programs (`initdb`, `pg_basebackup`, `postgres`): a primary and its
//! streaming standbys, on free ports, in a temporary directory, run as the
//! `postgres` user when the caller is root (the server refuses root).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::process::Process;

/// A directory of data directories, each named, and the programs to run
/// servers on them. Removed when dropped; drop the servers first.
#[derive(Debug)]
pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    user: Option<(u32, u32)>,
}

impl PgCluster {
    /// A fresh directory, or why servers cannot be started here.
    pub fn new() -> Result<PgCluster, String> {
        let bin = bin_dir()?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let user = server_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.path().display()))?;
        }
        Ok(PgCluster { dir, bin, user })
    }

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

    /// The path of `name` in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A new primary's data directory `data` (trust authentication, user
    /// `postgres`), listening on loopback only, its sockets in the
    /// directory, `fsync` off (a killed process loses nothing the kernel
    /// holds), WAL for streaming replicas, and `extra` settings.
    pub fn init_primary(&self, data: &str, extra: &str) {
        let path = self.path(data);
        self.run(
            "initdb",
            &[
                "-D",
                path.to_str().expect("a UTF-8 path"),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        let sockets = self.dir.path().display().to_string();
        self.configure(
            data,
            &format!(
                "listen_addresses = '127.0.0.1'\nunix_socket_directories = '{sockets}'\n\
                 fsync = off\nshared_buffers = 16MB\nmax_connections = 60\n\
                 wal_level = replica\nmax_wal_senders = 4\n{extra}\n"
            ),
        );
    }

    /// A standby's data directory `data`, copied from the primary on
    /// `primary` by `pg_basebackup`, that streams from `stream_from` (the
    /// primary's port, or a relay's) as `application_name` `name`, with
    /// `extra` settings.
    pub fn init_standby(
        &self,
        data: &str,
        primary: u16,
        stream_from: u16,
        name: &str,
        extra: &str,
    ) {
        let path = self.path(data);
        self.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.to_string(),
                "-U",
                "postgres",
                "-D",
                path.to_str().expect("a UTF-8 path"),
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        );
        self.configure(
            data,
            &format!(
                "primary_conninfo = 'host=127.0.0.1 port={stream_from} user=postgres \
                 application_name={name}'\n{extra}\n"
            ),
        );
        let signal = path.join("standby.signal");
        std::fs::write(&signal, "").expect("standby.signal");
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::chown(&signal, Some(uid), Some(gid)).expect("chown standby.signal");
        }
    }

    /// Appends `lines` to `postgresql.conf` of the data directory `data`.
    pub fn configure(&self, data: &str, lines: &str) {
        let mut file = OpenOptions::new()
            .append(true)
            .open(self.path(data).join("postgresql.conf"))
            .expect("postgresql.conf");
        file.write_all(lines.as_bytes())
            .expect("postgresql.conf written");
    }

    /// The server on the data directory `data` and `port`, its log beside
    /// it; killed (SIGKILL) when dropped.
    pub fn start(&self, data: &str, port: u16) -> Process {
        let log = std::fs::File::create(self.path(&format!("{data}.log"))).expect("a log file");
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.path(data))
            .args(["-c", &format!("port={port}")])
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .expect("postgres starts");
        Process::from(child)
    }

    /// What the server on `data` logged.
    pub fn log(&self, data: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{data}.log"))).unwrap_or_default()
    }

    /// The URL of the server on `port`.
    pub fn url(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }
}

/// The directory of the server's programs, or why there is none.
pub(crate) fn bin_dir() -> Result<PathBuf, String> {
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

/// Who runs the servers: the `postgres` user's ids when the caller is
/// root, or nobody else.
pub(crate) fn server_user() -> Option<(u32, u32)> {
    user_if_root("postgres")
}

/// The user `name`'s ids when the caller is root (a server refuses to run
/// as root), or `None`: the caller itself runs it.
pub(crate) fn user_if_root(name: &str) -> Option<(u32, u32)> {
    let me = std::fs::read_to_string("/proc/self/status").ok()?;
    let root = me
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"));
    if !root {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let line = passwd
        .lines()
        .find(|line| line.split(':').next() == Some(name))?;
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
}
