//! A process killed with SIGKILL in the middle of a load loses no outcome
//! it had reported as recorded, and leaves no record corrupted.
//!
//! The child runs `execute` from many tasks at once (so group commits are
//! in flight when it dies) and prints each key once `execute` returned; the
//! parent kills it, reopens the file and replays every printed key.
//! Rounds alternate between `Synchronous::Full` and `Synchronous::Normal`,
//! since both promise to survive the process being killed.
//! `IDEM_SQLITE_KILL_ROUNDS` (default 2) and `IDEM_SQLITE_KILL_RECORDS`
//! (default 400 per round) make the trial heavier.

use std::collections::HashSet;
use std::convert::Infallible;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use idem_core::store::{State, Store};
use idem_core::Idempotent;
use idem_sqlite::rusqlite::Connection;
use idem_sqlite::{SqliteStore, Synchronous};

use crate::support::{child_db, ChildProcess};

const ROLE: &str = "execute-until-killed";
const TEST: &str = "crash::outcomes_reported_before_a_kill_9_all_replay_after_reopening";
const TASKS: usize = 16;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn outcome(key: &str) -> String {
    format!("{key}: {}", "x".repeat(80))
}

/// The child's part: execute fresh keys from many tasks until killed.
fn execute_until_killed(db: &Path) {
    let round = std::env::var("IDEM_SQLITE_KILL_ROUND").unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(db)
            .await
            .expect("the child opens the file");
        let store = match std::env::var("IDEM_SQLITE_KILL_SYNC").as_deref() {
            Ok("normal") => store.with_synchronous(Synchronous::Normal),
            _ => store,
        };
        let idem = Idempotent::new(store);
        // A child whose parent is gone must not run forever.
        let until = Instant::now() + Duration::from_secs(120);
        let tasks = (0..TASKS).map(|task| {
            let (idem, round) = (idem.clone(), round.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    if Instant::now() > until {
                        return;
                    }
                    let key = format!("r{round}-t{task}-{i}");
                    let value = idem
                        .execute(&key, &key, || async { Ok::<_, Infallible>(outcome(&key)) })
                        .await
                        .expect("the child's executions succeed");
                    assert_eq!(value, outcome(&key));
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "recorded {key}").unwrap();
                    out.flush().unwrap();
                }
            })
        });
        for task in tasks.collect::<Vec<_>>() {
            task.await.unwrap();
        }
    });
}

#[test]
fn outcomes_reported_before_a_kill_9_all_replay_after_reopening() {
    if let Some(db) = child_db(ROLE) {
        return execute_until_killed(&db);
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let mut reported = Vec::new();
    for round in 0..setting("IDEM_SQLITE_KILL_ROUNDS", 2) {
        let sync = if round % 2 == 0 { "full" } else { "normal" };
        let round = round.to_string();
        let env = [
            ("IDEM_SQLITE_KILL_ROUND", round.as_str()),
            ("IDEM_SQLITE_KILL_SYNC", sync),
        ];
        let mut child = ChildProcess::spawn_with(TEST, ROLE, &db, &env);
        let wanted = setting("IDEM_SQLITE_KILL_RECORDS", 400);
        let mut this_round = 0;
        while this_round < wanted {
            let line = child
                .line(Duration::from_secs(60))
                .expect("the child keeps reporting records");
            if let Some(key) = line.strip_prefix("recorded ") {
                reported.push(key.to_owned());
                this_round += 1;
            }
        }
        child.child.kill().expect("SIGKILL is sent");
        child.child.wait().unwrap();
        // Lines written before the kill were reported too.
        let late = child.rest();
        reported.extend(
            late.iter()
                .filter_map(|l| l.strip_prefix("recorded ").map(str::to_owned)),
        );
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(check_after_kills(&db, &reported));
}

async fn check_after_kills(db: &Path, reported: &[String]) {
    let integrity: String = Connection::open(db)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(integrity, "ok", "the file survived the kills intact");

    let store = SqliteStore::open(db).await.expect("the file reopens");
    let idem = Idempotent::new(store);
    for key in reported {
        let replayed: String = idem
            .execute(key, key, || async {
                panic!("the work for {key} ran again: its outcome was lost");
                #[allow(unreachable_code)]
                Ok::<_, Infallible>(String::new())
            })
            .await
            .unwrap_or_else(|error| panic!("{key} was reported recorded but fails: {error}"));
        assert_eq!(replayed, outcome(key));
    }

    // Records nobody heard about (cut off by the kill) may be absent or
    // in flight, but none may be unreadable or hold a wrong outcome.
    let reported: HashSet<&str> = reported.iter().map(String::as_str).collect();
    let keys: Vec<String> = {
        let conn = Connection::open(db).unwrap();
        let mut statement = conn.prepare("SELECT key FROM idem_records").unwrap();
        let rows = statement.query_map([], |row| row.get(0)).unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    };
    assert!(keys.len() >= reported.len());
    eprintln!(
        "{} outcomes reported before the kills, {} records in the file",
        reported.len(),
        keys.len()
    );
    for key in &keys {
        let record = idem
            .store()
            .load(key)
            .await
            .expect("every row decodes")
            .expect("live");
        let client_key = idem_core::Key::new("", "", key.rsplit(':').next().unwrap()).unwrap();
        assert_eq!(client_key.as_str(), key);
        match record.state {
            State::Completed => {
                let stored: String = serde_json::from_slice(&record.payload).unwrap();
                assert_eq!(stored, outcome(client_key.client_key()));
            }
            State::InFlight => assert!(
                !reported.contains(client_key.client_key()),
                "{key} was reported recorded but is still in flight"
            ),
            State::Failed => panic!("{key} holds a failure nobody recorded"),
        }
    }
}
