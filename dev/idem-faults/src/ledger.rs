//! The side-effect ledger: an append-only file every run of the work writes
//! to, so a test can count what really happened against what callers were
//! told.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch on this machine's clock.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An open ledger. Each line is written with one `write` call on a file
/// opened for appending, so lines from concurrent processes never
/// interleave, and a process killed with SIGKILL loses no written line (the
/// kernel holds it).
#[derive(Debug)]
pub struct Ledger(File);

impl Ledger {
    /// Opens (creating) the ledger at `path` for appending.
    pub fn open(path: &Path) -> io::Result<Ledger> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(Ledger)
    }

    /// Appends one event.
    pub fn append(&self, event: &Event) -> io::Result<()> {
        let line = format!(
            "{} {} {} {} {}\n",
            event.kind.as_str(),
            event.key,
            event.worker,
            event.nonce,
            event.at_ms
        );
        (&self.0).write_all(line.as_bytes())
    }
}

/// What a ledger line says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A run of the work began (the side effect starts here).
    Start,
    /// A run of the work finished its side effect.
    Done,
    /// A worker killed itself with SIGKILL (the key field names the point).
    Kill,
}

impl EventKind {
    fn as_str(self) -> &'static str {
        match self {
            EventKind::Start => "start",
            EventKind::Done => "done",
            EventKind::Kill => "kill",
        }
    }
}

/// One ledger line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The client key (for `Kill`, the point it died at).
    pub key: String,
    /// The worker that wrote it.
    pub worker: String,
    /// The run's nonce, which is also the outcome it returns.
    pub nonce: String,
    /// When, in Unix milliseconds.
    pub at_ms: u64,
}

/// One run of the work, assembled from its `start` and `done` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The client key.
    pub key: String,
    /// The worker that ran it.
    pub worker: String,
    /// Its nonce (its outcome).
    pub nonce: String,
    /// When it started.
    pub started_ms: u64,
    /// Whether it finished its side effect.
    pub done: bool,
}

/// Everything a ledger holds, read back.
#[derive(Debug, Default)]
pub struct History {
    /// Runs by key, in start order.
    pub runs: HashMap<String, Vec<Run>>,
    /// Workers that killed themselves, with when.
    pub self_kills: HashMap<String, u64>,
}

/// Reads a ledger back. A line that does not parse is an error: the ledger
/// must never be damaged.
pub fn read(path: &Path) -> io::Result<History> {
    let mut history = History::default();
    let mut index: HashMap<String, (String, usize)> = HashMap::new();
    for line in BufReader::new(File::open(path)?).lines() {
        let line = line?;
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad ledger line {line:?}"),
            )
        };
        let parts: Vec<&str> = line.split(' ').collect();
        let [kind, key, worker, nonce, at] = parts[..] else {
            return Err(bad());
        };
        let at_ms: u64 = at.parse().map_err(|_| bad())?;
        match kind {
            "start" => {
                let runs = history.runs.entry(key.to_owned()).or_default();
                index.insert(nonce.to_owned(), (key.to_owned(), runs.len()));
                runs.push(Run {
                    key: key.to_owned(),
                    worker: worker.to_owned(),
                    nonce: nonce.to_owned(),
                    started_ms: at_ms,
                    done: false,
                });
            }
            "done" => {
                let (key, i) = index.get(nonce).ok_or_else(bad)?;
                history.runs.get_mut(key).ok_or_else(bad)?[*i].done = true;
            }
            "kill" => {
                history.self_kills.insert(worker.to_owned(), at_ms);
            }
            _ => return Err(bad()),
        }
    }
    for runs in history.runs.values_mut() {
        runs.sort_by_key(|run| run.started_ms);
    }
    Ok(history)
}
