//! Application processes whose clocks disagree by ten minutes, sharing one
//! store: leases live on the store's clock, so a takeover happens when the
//! store says the lease lapsed, never earlier and never later, whichever
//! process is ahead.
//!
//! Each `clock-worker` runs with its clock skewed by libfaketime (from
//! Debian's `faketime`): five minutes behind or ahead of the machine's.
//! Two cases per store, each in both directions (the owner behind and the
//! taker ahead, then the other way round):
//! - a stalled owner (2 s lease): its work starts and it is killed with
//!   SIGKILL; the other process takes the key over no sooner than one
//!   lease after the owner started and no later than 15 s after the kill
//!   (a deadline read on either skewed clock would be minutes off; a
//!   SQLite file shared under these skews is taken over within 15 ms).
//! - a live owner (3 s lease): its work runs two leases while its
//!   heartbeat renews the lease; the other process, polling all the
//!   while, never runs the work and is told the owner's outcome.
//!
//! SQLite is left out: its deadlines are read from the clock of the host
//! the file lives on, which every process sharing the file shares.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_faults::{unique_name, Backend};
use idem_testing::{Isolation, StoreKind, TestStore};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const LEASE: Duration = Duration::from_millis(2000);
/// The live owner's lease: its heartbeat has two thirds of it to land.
const LIVE_LEASE: Duration = Duration::from_millis(3000);
const SKEW_SECS: i64 = 300;

struct Worker {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    name: String,
}

impl Worker {
    /// A worker named `name` with its clock `skew` seconds off, whose work
    /// lasts `work` (zero: forever).
    async fn spawn(
        name: &str,
        key: &str,
        skew: i64,
        (lease, work): (Duration, Duration),
        backend: &Backend,
    ) -> Worker {
        let exe = Path::new(env!("CARGO_BIN_EXE_clock-worker"));
        let mut child = Command::new(exe)
            .args([name, key])
            .arg(lease.as_millis().to_string())
            .arg(work.as_millis().to_string())
            .args(backend.to_args())
            .env("LD_PRELOAD", LIBFAKETIME)
            .env("FAKETIME", format!("{skew:+}"))
            // Intervals (the heartbeat's, the poll's) stay true.
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("clock-worker starts");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut worker = Worker {
            child,
            lines,
            name: name.to_owned(),
        };
        // The skew took: the worker's clock is off by about `skew`.
        let clock = worker.line().await;
        let theirs: i128 = clock
            .strip_prefix("clock ")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("{name}: {clock}"));
        let ours = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i128;
        let off = (theirs - ours) as f64 / 1000.0;
        assert!(
            (off - skew as f64).abs() < 30.0,
            "{name}: its clock is {off} s off, not {skew} s"
        );
        worker
    }

    async fn line(&mut self) -> String {
        match tokio::time::timeout(Duration::from_secs(60), self.lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            other => panic!("{}: no line: {other:?}", self.name),
        }
    }

    /// The next line that is not `busy`, when it came, and how many `busy`
    /// lines came before it.
    async fn next_news(&mut self) -> (String, Instant, usize) {
        let mut busy = 0;
        loop {
            let line = self.line().await;
            if line == "busy" {
                busy += 1;
            } else {
                return (line, Instant::now(), busy);
            }
        }
    }

    async fn kill(mut self) {
        self.child.kill().await.expect("SIGKILL");
    }
}

/// A stalled owner skewed by `owner`, a taker skewed by `taker`.
async fn stalled_owner(backend: &Backend, owner: i64, taker: i64) {
    let key = format!("stalled{owner:+}");
    let started = Instant::now();
    let mut first = Worker::spawn("owner", &key, owner, (LEASE, Duration::ZERO), backend).await;
    let (line, ran, _) = first.next_news().await;
    assert_eq!(line, "ran", "the owner");
    first.kill().await;
    let killed = Instant::now();
    let mut second = Worker::spawn(
        "taker",
        &key,
        taker,
        (LEASE, Duration::from_millis(10)),
        backend,
    )
    .await;
    let (line, took_over, busy) = second.next_news().await;
    assert_eq!(line, "ran", "the taker");
    let (told, _, _) = second.next_news().await;
    assert_eq!(told, "told taker");
    eprintln!(
        "{}: owner {owner:+} s, taker {taker:+} s: taken over {:?} after the owner started, \
         {:?} after its work began, {:?} after the kill, {busy} refusals first",
        backend.name(),
        took_over - started,
        took_over - ran,
        took_over - killed,
    );
    assert!(
        took_over - started >= LEASE,
        "taken over before the lease could lapse: {:?}",
        took_over - started
    );
    assert!(
        took_over - killed <= LEASE + Duration::from_secs(15),
        "taken over long after the lease lapsed: {:?}",
        took_over - killed
    );
}

/// A live owner skewed by `owner`, its work two leases long, and a
/// second process skewed by `other` polling the key meanwhile.
async fn live_owner(backend: &Backend, owner: i64, other: i64) {
    let key = format!("live{owner:+}");
    let mut first =
        Worker::spawn("owner", &key, owner, (LIVE_LEASE, LIVE_LEASE * 2), backend).await;
    let (line, _, _) = first.next_news().await;
    assert_eq!(line, "ran", "the owner");
    let mut second = Worker::spawn(
        "other",
        &key,
        other,
        (LIVE_LEASE, Duration::from_millis(10)),
        backend,
    )
    .await;
    let (line, _, busy) = second.next_news().await;
    assert_eq!(
        line, "told owner",
        "the other process ran the work of a live owner"
    );
    let (line, _, _) = first.next_news().await;
    assert_eq!(line, "told owner");
    eprintln!(
        "{}: owner {owner:+} s, other {other:+} s: {busy} refusals while the owner worked",
        backend.name()
    );
    assert!(busy > 0, "the other process never found the key in flight");
}

async fn on(kind: StoreKind) {
    if !Path::new(LIBFAKETIME).exists() {
        let _ = idem_testing::skip::<()>(&format!(
            "{LIBFAKETIME} is missing (Debian's faketime package)"
        ));
        return;
    }
    let Some(server) = kind.server() else { return };
    let Some(url) = server.require() else { return };
    let scope = unique_name("clocks");
    let _guard = server.cleanup(&url, kind.isolation(), &scope);
    let backend = Backend::new(kind, url, scope);
    tokio::join!(
        stalled_owner(&backend, -SKEW_SECS, SKEW_SECS),
        stalled_owner(&backend, SKEW_SECS, -SKEW_SECS),
        live_owner(&backend, -SKEW_SECS, SKEW_SECS),
        live_owner(&backend, SKEW_SECS, -SKEW_SECS),
    );
}

/// Every store on a server, side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeovers_follow_the_stores_clock_whatever_the_processes_clocks_say() {
    let mut runs = tokio::task::JoinSet::new();
    for kind in StoreKind::ALL {
        if kind.isolation() != Isolation::Process && kind.server().is_some() {
            runs.spawn(on(kind));
        }
    }
    let mut tried = 0;
    while let Some(run) = runs.join_next().await {
        run.unwrap();
        tried += 1;
    }
    assert!(tried >= 3, "only {tried} stores tried");
}
