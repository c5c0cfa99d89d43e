//! The `idem` command run as a process against every store on its real
//! server: what it reads matches what the library wrote, it releases only
//! with the token it showed, it resets only settled records, and it purges
//! only expired records.

use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::store::Store;
use idem_core::{Begin, Error, Fingerprint, Idempotent};
use idem_testing::{unique_name, Cleanup, Server, StoreKind};
use serde_json::json;

const NAMESPACE: &str = "cli";

/// A store a test writes with the library and the command reads by URL.
struct Opened {
    store: Arc<dyn Store>,
    /// `--store` and the options naming this store's table or prefix.
    args: Vec<String>,
    _guard: Cleanup,
}

async fn opened(kind: StoreKind) -> Option<Opened> {
    let name = unique_name("idem_cli");
    let (url, option, guard) = match kind {
        StoreKind::Sqlite => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let path = dir.path().join("idem.db").display().to_string();
            (path, vec![], Cleanup::holding(dir))
        }
        StoreKind::Redis => {
            let url = Server::Redis.require()?;
            let guard = Cleanup::redis_prefix(&url, &format!("{name}:"));
            (url, vec!["--prefix".into(), format!("{name}:")], guard)
        }
        StoreKind::Postgres => {
            let url = Server::Postgres.require()?;
            let guard = Cleanup::postgres(&url, format!("DROP TABLE IF EXISTS {name}"));
            (url, vec!["--table".into(), name.clone()], guard)
        }
        StoreKind::MySql => {
            let url = Server::MySql.require()?;
            let guard = Cleanup::mysql(&url, format!("DROP TABLE IF EXISTS {name}"));
            (url, vec!["--table".into(), name.clone()], guard)
        }
        other => panic!("the command does not open {other:?}"),
    };
    let store = kind
        .open(&url, Some(&name))
        .await
        .unwrap_or_else(|e| panic!("{kind:?} at {url}: {e}"));
    let url = match kind {
        StoreKind::Sqlite => format!("sqlite:{url}"),
        _ => url,
    };
    let mut args = vec!["--store".to_owned(), url];
    args.extend(option);
    Some(Opened {
        store,
        args,
        _guard: guard,
    })
}

impl Opened {
    /// Runs `idem` with this store and `args`.
    async fn idem(&self, args: &[&str]) -> (bool, String) {
        let mut all = self.args.clone();
        all.extend(args.iter().map(|s| s.to_string()));
        let output: Output = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
                .args(&all)
                .env_remove("IDEM_STORE")
                .output()
                .expect("the idem binary runs")
        })
        .await
        .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.idem(args).await;
        assert!(ok, "idem {args:?} failed: {text}");
        text
    }
}

/// The number after `label` on its line of `stats` output.
fn count(stats: &str, label: &str) -> u64 {
    stats
        .lines()
        .find_map(|line| line.strip_prefix(label))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in {stats}"))
}

/// The token on `inspect`'s `token` line.
fn token(inspected: &str) -> String {
    inspected
        .lines()
        .find_map(|line| line.strip_prefix("token"))
        .map(|rest| rest.trim().to_owned())
        .unwrap_or_else(|| panic!("no token in {inspected}"))
}

/// Follows `list` pages of `limit` records and returns every line listed.
/// How many pages a listing takes depends on what else the server holds
/// (a Redis page ends with the scan step that found records, and a shared
/// server's keys are mostly other data), so the listing is bounded by its
/// progress: a cursor given twice is a loop and fails.
async fn list_all(opened: &Opened, which: &str, limit: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut after: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    // Far more pages than any server here holds keys for, against a store
    // that hands out new cursors for ever.
    for _ in 0..100_000 {
        let mut args = vec!["list", which, "--limit", limit];
        if let Some(after) = &after {
            args.extend(["--after", after]);
        }
        let out = opened.ok(&args).await;
        lines.extend(
            out.lines()
                .filter(|l| l.contains(" token "))
                .map(str::to_owned),
        );
        match out
            .lines()
            .find_map(|l| l.strip_prefix("next page: --after "))
        {
            Some(next) => {
                let next = next.trim().to_owned();
                assert!(seen.insert(next.clone()), "the listing came back to {next}");
                after = Some(next);
            }
            None => {
                assert!(out.contains("no more pages"), "{out}");
                return lines;
            }
        }
    }
    panic!("the listing did not end in 100,000 pages");
}

/// Writes records in every state, then checks each command against them.
async fn every_command_reads_and_writes_only_what_it_says(kind: StoreKind) {
    let Some(opened) = opened(kind).await else {
        return;
    };
    let idem = Idempotent::from_arc(Arc::clone(&opened.store)).with_namespace(NAMESPACE);
    let body = json!({"amount": 1250});
    let done: String = idem
        .execute("done-1", &body, || async { Ok::<_, ()>("ch_1".to_owned()) })
        .await
        .unwrap();
    assert_eq!(done, "ch_1");
    let declined: Result<(), Error<String>> = idem
        .execute_remembering(
            "declined",
            &body,
            |_| true,
            || async { Err("card declined".to_owned()) },
        )
        .await;
    assert!(matches!(declined, Err(Error::Work(_))));
    // Two keys held by an owner that went away: in flight, lease live.
    let fingerprint = Fingerprint::of_json(&body).unwrap();
    for key in ["stuck-a", "stuck-b"] {
        assert!(matches!(
            idem.begin(key, fingerprint).await.unwrap(),
            Begin::Run(_)
        ));
    }
    // One outcome kept only briefly, to expire: long enough to be counted
    // by the `stats` just below on a loaded machine (300 ms was not always),
    // and waited out before the purge.
    let brief = idem
        .clone()
        .with_lease(Duration::from_secs(3))
        .with_retention(Duration::from_secs(3));
    let _: u8 = brief
        .execute("brief", &body, || async { Ok::<_, ()>(1) })
        .await
        .unwrap();

    let stats = opened.ok(&["stats"]).await;
    assert_eq!(count(&stats, "in flight"), 2, "{stats}");
    assert_eq!(count(&stats, "completed"), 2, "{stats}");
    assert_eq!(count(&stats, "failed"), 1, "{stats}");

    let inspected = opened
        .ok(&["inspect", "done-1", "--namespace", NAMESPACE])
        .await;
    assert!(inspected.contains("completed"), "{inspected}");
    assert!(inspected.contains("6 bytes: \"ch_1\""), "{inspected}");
    assert!(inspected.contains(&fingerprint.to_string()), "{inspected}");
    let absent = opened.ok(&["inspect", "done-1"]).await;
    assert!(absent.contains("absent"), "another namespace: {absent}");

    // Listing pages one record at a time still finds both stuck keys.
    let in_flight = list_all(&opened, "--in-flight", "1").await;
    assert_eq!(in_flight.len(), 2, "{in_flight:?}");
    assert!(in_flight.iter().any(|l| l.starts_with("stuck-a ")));
    assert!(in_flight.iter().any(|l| l.starts_with("stuck-b ")));
    let failed = list_all(&opened, "--failed", "10").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].starts_with("declined "), "{failed:?}");

    // Release is fenced: another token is refused and changes nothing.
    let shown = opened
        .ok(&["inspect", "stuck-a", "--namespace", NAMESPACE])
        .await;
    assert!(shown.contains("in flight, lease"), "{shown}");
    let (ok, refused) = opened
        .idem(&[
            "release",
            "stuck-a",
            "--namespace",
            NAMESPACE,
            "--token",
            &"0".repeat(32),
        ])
        .await;
    assert!(!ok && refused.contains("refused"), "{refused}");
    let stuck = idem.key("stuck-a").unwrap();
    assert!(opened.store.load(stuck.as_str()).await.unwrap().is_some());
    let (ok, refused) = opened
        .idem(&["release", "stuck-a", "--namespace", NAMESPACE])
        .await;
    assert!(!ok, "release without a token must not run: {refused}");
    let released = opened
        .ok(&[
            "release",
            "stuck-a",
            "--namespace",
            NAMESPACE,
            "--token",
            &token(&shown),
        ])
        .await;
    assert!(released.contains("released"), "{released}");
    assert!(opened.store.load(stuck.as_str()).await.unwrap().is_none());
    // The released key runs its work again, exactly once.
    let mut runs = 0;
    for _ in 0..2 {
        let _: u8 = idem
            .execute("stuck-a", &body, || {
                runs += 1;
                async { Ok::<_, ()>(2) }
            })
            .await
            .unwrap();
    }
    assert_eq!(runs, 1);
    // The same token again: the record now holds a newer one.
    let (ok, again) = opened
        .idem(&[
            "release",
            "stuck-a",
            "--namespace",
            NAMESPACE,
            "--token",
            &token(&shown),
        ])
        .await;
    assert!(!ok && again.contains("not in flight"), "{again}");

    // Purge deletes the expired record and nothing live.
    let brief_key = idem.key("brief").unwrap();
    let start = Instant::now();
    while opened
        .store
        .load(brief_key.as_str())
        .await
        .unwrap()
        .is_some()
    {
        assert!(start.elapsed() < Duration::from_secs(10), "never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dry = opened.ok(&["purge", "--dry-run"]).await;
    let purged = opened.ok(&["purge"]).await;
    // Every store keeps a lapsed record until a purge (Redis records carry
    // no TTL, so an evicting policy cannot take them).
    assert!(dry.starts_with("1 expired"), "{dry}");
    assert!(purged.contains("purged 1 "), "{purged}");
    let stats = opened.ok(&["stats"]).await;
    assert_eq!(count(&stats, "expired"), 0, "{stats}");
    assert_eq!(count(&stats, "completed"), 2, "done-1 and stuck-a: {stats}");
    assert_eq!(count(&stats, "in flight"), 1, "{stats}");

    // Reset refuses a key in flight and changes nothing.
    let stuck_b = idem.key("stuck-b").unwrap();
    let held = opened.store.load(stuck_b.as_str()).await.unwrap().unwrap();
    let (ok, refused) = opened
        .idem(&["reset", "stuck-b", "--namespace", NAMESPACE])
        .await;
    assert!(!ok && refused.contains("refused to reset"), "{refused}");
    assert!(refused.contains(&held.token.to_string()), "{refused}");
    let after = opened.store.load(stuck_b.as_str()).await.unwrap().unwrap();
    assert_eq!((after.state, after.token), (held.state, held.token));
    // A key in another namespace is absent: nothing to reset.
    let elsewhere = opened.ok(&["reset", "done-1"]).await;
    assert!(elsewhere.contains("nothing to reset"), "{elsewhere}");
    // Reset deletes the remembered failure, with an audit line that names
    // the key by its hash only, who asked and why; the key runs again.
    let declined_key = idem.key("declined").unwrap();
    let reset = opened
        .ok(&[
            "reset",
            "declined",
            "--namespace",
            NAMESPACE,
            "--by",
            "ops-on-call",
            "--reason",
            "card issuer fixed",
        ])
        .await;
    assert!(reset.contains("deleted its failed record"), "{reset}");
    let audit = reset
        .lines()
        .find(|l| l.contains("idem::audit"))
        .unwrap_or_else(|| panic!("no audit line: {reset}"));
    for part in [
        idem_core::observe::key_hash(declined_key.as_str()).as_str(),
        "deleted",
        "ops-on-call",
        "card issuer fixed",
    ] {
        assert!(audit.contains(part), "{part:?} missing from {audit}");
    }
    assert!(
        !audit.contains("declined"),
        "the audit line shows the key: {audit}"
    );
    let mut runs = 0;
    for _ in 0..2 {
        let _: u8 = idem
            .execute("declined", &body, || {
                runs += 1;
                async { Ok::<_, ()>(3) }
            })
            .await
            .unwrap();
    }
    assert_eq!(runs, 1, "a reset key runs its work again, once");
    let gone = opened
        .ok(&["reset", "done-1", "--namespace", NAMESPACE])
        .await;
    assert!(gone.contains("deleted its completed record"), "{gone}");
    let stats = opened.ok(&["stats"]).await;
    assert_eq!(
        count(&stats, "completed"),
        2,
        "stuck-a and declined: {stats}"
    );
    assert_eq!(count(&stats, "failed"), 0, "{stats}");
    assert_eq!(count(&stats, "in flight"), 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_every_command_reads_and_writes_only_what_it_says() {
    every_command_reads_and_writes_only_what_it_says(StoreKind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_every_command_reads_and_writes_only_what_it_says() {
    every_command_reads_and_writes_only_what_it_says(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_every_command_reads_and_writes_only_what_it_says() {
    every_command_reads_and_writes_only_what_it_says(StoreKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_every_command_reads_and_writes_only_what_it_says() {
    every_command_reads_and_writes_only_what_it_says(StoreKind::MySql).await;
}

#[tokio::test]
async fn refuses_without_a_store_or_with_an_unknown_one() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .env_remove("IDEM_STORE")
            .output()
            .unwrap()
    };
    let none = run(&["stats"]);
    assert_eq!(none.status.code(), Some(2));
    let unknown = run(&["--store", "ftp://x", "stats"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown store URL"));
    let missing = run(&["--store", "sqlite:/nonexistent/idem.db", "stats"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(!std::path::Path::new("/nonexistent/idem.db").exists());
}
