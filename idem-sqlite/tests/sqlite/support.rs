//! Fresh stores on temporary files, records to write, and child processes
//! (this test binary run again with a role to play).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use idem_core::store::{NewRecord, State, Token};
use idem_core::Fingerprint;
use idem_sqlite::SqliteStore;
use tempfile::TempDir;

const ROLE: &str = "IDEM_SQLITE_CHILD_ROLE";
const DB: &str = "IDEM_SQLITE_CHILD_DB";

/// A new store on a file of its own; the directory goes with the guard.
pub(crate) async fn fresh() -> (SqliteStore, TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path).await.expect("a new file opens");
    (store, dir, path)
}

pub(crate) fn fingerprint(body: &str) -> Fingerprint {
    Fingerprint::of_bytes(body.as_bytes())
}

/// An `InFlight` record with the given lease and retention.
pub(crate) fn in_flight(token: Token, lease: Duration, retention: Duration) -> NewRecord<'static> {
    NewRecord {
        token,
        fingerprint: fingerprint("body"),
        state: State::InFlight,
        payload: b"",
        lease: Some(lease),
        retention,
    }
}

/// A `Completed` record holding `payload`.
pub(crate) fn completed(token: Token, payload: &[u8], retention: Duration) -> NewRecord<'_> {
    NewRecord {
        token,
        fingerprint: fingerprint("body"),
        state: State::Completed,
        payload,
        lease: None,
        retention,
    }
}

/// The database path this process was given, if it was started as a child
/// to play `role`.
pub(crate) fn child_db(role: &str) -> Option<PathBuf> {
    if std::env::var(ROLE).ok()? != role {
        return None;
    }
    // The harness has printed "test <name> ... " without a newline; end
    // that line so the child's own lines start clean.
    let mut out = std::io::stdout().lock();
    writeln!(out)
        .and_then(|()| out.flush())
        .expect("stdout is open");
    Some(PathBuf::from(
        std::env::var_os(DB).expect("a child is given its database"),
    ))
}

/// A child process: this binary, running only the test `test` (its path
/// inside the binary, such as `crash::some_test`) with `role` and `db`.
pub(crate) struct ChildProcess {
    pub(crate) child: Child,
    lines: mpsc::Receiver<String>,
}

impl ChildProcess {
    pub(crate) fn spawn(test: &str, role: &str, db: &Path) -> ChildProcess {
        ChildProcess::spawn_with(test, role, db, &[])
    }

    /// Like [`spawn`](ChildProcess::spawn), with more environment variables.
    pub(crate) fn spawn_with(
        test: &str,
        role: &str,
        db: &Path,
        env: &[(&str, &str)],
    ) -> ChildProcess {
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env(DB, db)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the child starts");
        let stdout = child.stdout.take().expect("a piped stdout");
        let (sender, lines) = mpsc::channel();
        thread::spawn(move || forward_lines(stdout, &sender));
        ChildProcess { child, lines }
    }

    /// The next complete line the child printed, waiting at most `within`;
    /// `None` once its output ended or the time is up.
    pub(crate) fn line(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// Waits for the line `wanted`, skipping the test harness's chatter.
    pub(crate) fn expect_line(&self, wanted: &str, within: Duration) {
        let until = std::time::Instant::now() + within;
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match self.line(left) {
                Some(line) if line == wanted => return,
                Some(_) => {}
                None => break,
            }
        }
        panic!("the child never printed {wanted:?}");
    }

    /// Every complete line still to come, once the child has ended.
    pub(crate) fn rest(self) -> Vec<String> {
        self.lines.iter().collect()
    }
}

// Only lines that end in a newline count: a line cut short by a kill was
// never fully reported.
fn forward_lines(stdout: ChildStdout, sender: &mpsc::Sender<String>) {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line.ends_with('\n') => {
                if sender.send(line.trim_end().to_owned()).is_err() {
                    return;
                }
            }
            Ok(_) => return,
        }
    }
}
