//! The crash supervisor: runs worker processes against one store, kills
//! them with SIGKILL at random moments (and lets them kill themselves at
//! chosen points), then checks the ledger against what callers were told.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idem_core::{Error, Idempotent};
use rand::Rng;

use crate::ledger::{self, now_ms, Event, EventKind, Ledger};
use crate::Backend;

/// How a crash trial runs.
#[derive(Debug, Clone)]
pub struct Trial {
    /// Worker processes alive at once.
    pub workers: usize,
    /// Distinct keys they share.
    pub keys: u32,
    /// The lease every worker uses.
    pub lease: Duration,
    /// How long workers run and get killed.
    pub duration: Duration,
    /// The chance, per thousand, that a worker kills itself at each of four
    /// points: before the claim, mid-work, after the work before recording,
    /// after recording.
    pub self_kill_per_mille: u32,
    /// The longest pause between two kills by the supervisor.
    pub max_kill_gap: Duration,
}

/// What a trial did, for the test's report.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Workers killed by the supervisor.
    pub killed: usize,
    /// Workers that killed themselves.
    pub self_killed: usize,
    /// Runs of the work (side effects begun).
    pub runs: usize,
    /// Outcomes callers were told were recorded.
    pub told: usize,
    /// Keys whose work ran more than once (each time after a crash).
    pub rerun_keys: usize,
    /// Keys that hold an outcome at the end.
    pub keys_completed: usize,
}

struct Worker {
    id: String,
    child: Child,
    reader: JoinHandle<()>,
}

/// Runs one trial and checks its invariants, returning what happened or the
/// first broken promise, explained.
pub async fn run(
    worker_exe: &Path,
    backend: &Backend,
    trial: &Trial,
    dir: &Path,
) -> Result<Outcome, String> {
    let ledger_path = dir.join("ledger.txt");
    Ledger::open(&ledger_path).map_err(|e| format!("ledger: {e}"))?;
    let told: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let mut killed_at: HashMap<String, u64> = HashMap::new();
    let mut next_id = 0usize;
    let mut spawn = |told: &Arc<Mutex<Vec<(String, String)>>>| -> Result<Worker, String> {
        next_id += 1;
        spawn_worker(
            worker_exe,
            &format!("w{next_id}"),
            backend,
            trial,
            &ledger_path,
            told,
        )
    };
    let mut workers: Vec<Worker> = (0..trial.workers)
        .map(|_| spawn(&told))
        .collect::<Result<_, _>>()?;

    let started = Instant::now();
    let mut next_kill = Instant::now() + random_gap(trial.max_kill_gap);
    while started.elapsed() < trial.duration {
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Workers that died by their own hand are replaced.
        for slot in &mut workers {
            if let Ok(Some(_)) = slot.child.try_wait() {
                let fresh = spawn(&told)?;
                let dead = std::mem::replace(slot, fresh);
                let _ = dead.reader.join();
            }
        }
        if Instant::now() >= next_kill {
            let victim = rand::rng().random_range(0..workers.len());
            // Noted before the signal, so it is no later than the death.
            killed_at.insert(workers[victim].id.clone(), now_ms());
            let fresh = spawn(&told)?;
            let mut dead = std::mem::replace(&mut workers[victim], fresh);
            let _ = dead.child.kill();
            let _ = dead.child.wait();
            let _ = dead.reader.join();
            next_kill = Instant::now() + random_gap(trial.max_kill_gap);
        }
    }
    for mut worker in workers {
        killed_at.insert(worker.id.clone(), now_ms());
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        let _ = worker.reader.join();
    }
    let killed = killed_at.len() - trial.workers;

    let finals = settle(backend, trial, &ledger_path).await?;
    let history = ledger::read(&ledger_path).map_err(|e| format!("ledger: {e}"))?;
    for (worker, at) in &history.self_kills {
        killed_at.insert(worker.clone(), *at);
    }
    let told = std::mem::take(&mut *told.lock().unwrap_or_else(|p| p.into_inner()));

    // Every outcome a caller was told replays unchanged.
    for (key, value) in &told {
        let now = finals.get(key).map(String::as_str);
        if now != Some(value.as_str()) {
            return Err(format!(
                "{key}: a caller was told {value}, the store now says {now:?}"
            ));
        }
    }
    let mut rerun_keys = 0;
    let mut runs = 0;
    for (key, key_runs) in &history.runs {
        runs += key_runs.len();
        rerun_keys += usize::from(key_runs.len() > 1);
        let winner = finals
            .get(key)
            .ok_or_else(|| format!("{key}: ran but holds no outcome"))?;
        let winners = key_runs.iter().filter(|run| &run.nonce == winner).count();
        if winners != 1 {
            return Err(format!(
                "{key}: the recorded outcome {winner} matches {winners} runs"
            ));
        }
        // A run that is not the recorded one must have been cut short by
        // a crash: a live worker always records what it ran.
        for run in key_runs.iter().filter(|run| &run.nonce != winner) {
            if !killed_at.contains_key(&run.worker) {
                return Err(format!(
                    "{key}: run {} by live worker {} was lost",
                    run.nonce, run.worker
                ));
            }
        }
        // Two runs of a key never overlap a live lease: the later one starts
        // only after the earlier one's worker died and its lease lapsed (at
        // least two thirds of a lease after death, given the heartbeat).
        for pair in key_runs.windows(2) {
            let (earlier, later) = (&pair[0], &pair[1]);
            let died = killed_at.get(&earlier.worker).copied();
            let lease_half = trial.lease.as_millis() as u64 / 2;
            match died {
                Some(died) if later.started_ms >= died + lease_half => {}
                _ => {
                    return Err(format!(
                        "{key}: run {} by {} started at {} while run {} by {} (died {died:?}) held the lease",
                        later.nonce, later.worker, later.started_ms, earlier.nonce, earlier.worker
                    ))
                }
            }
        }
    }
    let self_killed = history.self_kills.len();
    Ok(Outcome {
        killed,
        self_killed,
        runs,
        told: told.len(),
        rerun_keys,
        keys_completed: finals.len(),
    })
}

/// After the workers are gone: waits out their leases and asks every key
/// once more, so each ends with an outcome. Returns key → outcome.
async fn settle(
    backend: &Backend,
    trial: &Trial,
    ledger_path: &Path,
) -> Result<HashMap<String, String>, String> {
    let store = backend.open().await.map_err(|e| format!("reopen: {e}"))?;
    let idem = Idempotent::from_arc(store).with_lease(trial.lease);
    let ledger = Ledger::open(ledger_path).map_err(|e| format!("ledger: {e}"))?;
    let mut finals = HashMap::new();
    let give_up = Instant::now() + trial.lease * 3 + Duration::from_secs(5);
    let mut pending: HashSet<u32> = (0..trial.keys).collect();
    while !pending.is_empty() {
        for n in pending.clone() {
            let key = format!("key-{n}");
            let body = serde_json::json!({ "key": key });
            let outcome: Result<String, Error<String>> = idem
                .execute(&key, &body, || async {
                    let nonce = format!("{:016x}", rand::random::<u64>());
                    for kind in [EventKind::Start, EventKind::Done] {
                        let event = Event {
                            kind,
                            key: key.clone(),
                            worker: "settle".into(),
                            nonce: nonce.clone(),
                            at_ms: now_ms(),
                        };
                        ledger.append(&event).map_err(|e| e.to_string())?;
                    }
                    Ok(nonce)
                })
                .await;
            match outcome {
                Ok(value) => {
                    finals.insert(key, value);
                    pending.remove(&n);
                }
                Err(Error::InProgress { .. }) => {}
                Err(error) => return Err(format!("{key}: settling failed: {error}")),
            }
        }
        // Checked only while keys remain: the last round may settle them
        // just after the deadline, which is a success.
        if !pending.is_empty() && Instant::now() > give_up {
            return Err(format!(
                "{} keys still in progress long after every lease lapsed",
                pending.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(finals)
}

fn spawn_worker(
    exe: &Path,
    id: &str,
    backend: &Backend,
    trial: &Trial,
    ledger: &PathBuf,
    told: &Arc<Mutex<Vec<(String, String)>>>,
) -> Result<Worker, String> {
    let mut child = Command::new(exe)
        .arg(id)
        .arg(trial.keys.to_string())
        .arg(trial.lease.as_millis().to_string())
        .arg(ledger)
        .arg(trial.self_kill_per_mille.to_string())
        .args(backend.to_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", exe.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let told = Arc::clone(told);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut words = line.splitn(3, ' ');
            if let (Some("recorded"), Some(key), Some(value)) =
                (words.next(), words.next(), words.next())
            {
                told.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((key.to_owned(), value.to_owned()));
            } else {
                eprintln!("worker: {line}");
            }
        }
    });
    Ok(Worker {
        id: id.to_owned(),
        child,
        reader,
    })
}

fn random_gap(max: Duration) -> Duration {
    let max = max.as_millis().max(2) as u64;
    Duration::from_millis(rand::rng().random_range(max / 4..max))
}
