//! Tests on a Redis server of their own, started from the `redis-server`
//! binary: the server's own counters prove the round trips, and a restart
//! proves the store reconnects.

use crate::support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use idem_core::{Error, Idempotent};
use idem_redis::redis;
use idem_redis::RedisStore;
use serde_json::json;
use support::servers::{self, Servers};

fn own_server() -> Option<Servers> {
    if let Some(reason) = servers::binaries_missing() {
        return support::skip(&reason);
    }
    Some(Servers::standalone().unwrap_or_else(|e| panic!("cannot start redis-server: {e}")))
}

/// The server's own counters: calls per command (`INFO commandstats`)
/// and read events on client connections (`total_reads_processed`).
#[derive(Debug, Default, PartialEq)]
struct Counters {
    calls: BTreeMap<String, u64>,
    reads: u64,
}

/// Reads the counters over `admin`, an idle connection of its own: one
/// `INFO` is one read.
fn counters(admin: &mut redis::Connection) -> Counters {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("stats")
        .query(admin)
        .expect("INFO");
    let mut counters = Counters::default();
    for line in info.lines() {
        if let Some(reads) = line.strip_prefix("total_reads_processed:") {
            counters.reads = reads.trim().parse().unwrap();
        }
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="));
        counters
            .calls
            .insert(name.to_owned(), calls.unwrap().parse().unwrap());
    }
    counters
}

/// What the server did during `step`, leaving out the `INFO` that reads
/// the counters afterwards (it counts itself).
async fn during<F: std::future::Future>(admin: &mut redis::Connection, step: F) -> Counters {
    let before = counters(admin);
    step.await;
    let after = counters(admin);
    let calls = after
        .calls
        .into_iter()
        .filter(|(name, _)| name != "info")
        .map(|(name, calls)| {
            let delta = calls - before.calls.get(&name).copied().unwrap_or(0);
            (name, delta)
        })
        .filter(|(_, delta)| *delta > 0)
        .collect();
    Counters {
        calls,
        reads: after.reads - before.reads - 1,
    }
}

fn calls(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

#[tokio::test]
async fn each_call_costs_the_round_trips_the_design_promises() {
    let Some(server) = own_server() else { return };
    let url = &server.urls()[0];
    let store = RedisStore::connect(url.as_str()).await.unwrap();
    let idem = Idempotent::new(store);
    let body = json!({ "amount": 1250 });
    let run = |key: &'static str, body: serde_json::Value| {
        let idem = idem.clone();
        async move {
            idem.execute(key, &body, || async { Ok::<_, Infallible>("x".repeat(98)) })
                .await
        }
    };

    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();

    let first = during(&mut admin, async {
        run("k1", body.clone()).await.unwrap();
    })
    .await;
    let replay = during(&mut admin, async {
        run("k1", body.clone()).await.unwrap();
    })
    .await;
    let mismatch = during(&mut admin, async {
        let result = run("k1", json!({ "amount": 9 })).await;
        assert!(matches!(result, Err(Error::Mismatch)), "{result:?}");
    })
    .await;
    let held = idem.begin("k2", idem_core::Fingerprint::of_bytes(b"held"));
    let Ok(idem_core::Begin::Run(_lease)) = held.await else {
        panic!("could not claim k2")
    };
    let in_progress = during(&mut admin, async {
        let result = idem
            .begin("k2", idem_core::Fingerprint::of_bytes(b"held"))
            .await;
        assert!(
            matches!(result, Err(Error::InProgress { .. })),
            "{result:?}"
        );
    })
    .await;

    for (name, seen) in [
        ("first execution", &first),
        ("replay", &replay),
        ("mismatch", &mismatch),
        ("in progress", &in_progress),
    ] {
        eprintln!(
            "{name}: {} round trips, commands {:?}",
            seen.reads, seen.calls
        );
    }
    // A round trip is one request the server reads: a command, a script
    // call, or a MULTI … EXEC transaction sent in one write. The claim is
    // one script that reads the server's clock with the record, so a claim
    // that finds a record in flight knows its lease left at once.
    assert_eq!(first.reads, 2, "first execution: {first:?}");
    assert_eq!(replay.reads, 1, "replay: {replay:?}");
    assert_eq!(mismatch.reads, 1, "mismatch: {mismatch:?}");
    assert_eq!(in_progress.reads, 1, "in progress: {in_progress:?}");
    // The commands, exactly: the claim and the completion are one script
    // each (what runs inside is counted too), and nothing else. No command
    // sets an expiry: records are kept until the purge deletes them.
    assert_eq!(
        first.calls,
        calls(&[
            ("evalsha", 2),
            ("time", 2),
            ("get", 2),
            ("set", 2),
            // The deadlines, on the server's clock, written into the
            // value the script just set.
            ("setrange", 2),
            // The completion publishes the key to wake waiters, inside
            // the same script.
            ("publish", 1),
        ])
    );
    for (name, seen) in [
        ("replay", &replay),
        ("mismatch", &mismatch),
        ("in progress", &in_progress),
    ] {
        assert_eq!(
            seen.calls,
            calls(&[("evalsha", 1), ("time", 1), ("get", 1)]),
            "{name}"
        );
    }
}

#[tokio::test]
async fn the_store_reconnects_and_reloads_its_scripts_after_a_server_restart() {
    let Some(server) = own_server() else { return };
    let url = server.urls()[0].clone();
    let idem = Idempotent::new(RedisStore::connect(url.as_str()).await.unwrap());
    let charge = |key: &'static str| {
        let idem = idem.clone();
        async move {
            idem.execute(key, &json!({}), || async { Ok::<_, Infallible>(1) })
                .await
        }
    };
    assert_eq!(charge("before").await.unwrap(), 1);

    server.shut_down_first();
    let _restarted = Servers::standalone_on(server.ports()[0]).expect("restart redis-server");

    // The call that finds the old connection broken fails (before the work
    // ran, so it is safe to retry); the connection comes back by itself.
    let until = Instant::now() + Duration::from_secs(10);
    let mut failures = Vec::new();
    loop {
        match charge("after").await {
            Ok(value) => {
                assert_eq!(value, 1);
                break;
            }
            Err(error) => {
                assert!(
                    !error.work_ran(),
                    "a failed call reports that work ran: {error}"
                );
                failures.push(error.to_string());
                assert!(Instant::now() < until, "no reconnect in 10 s: {failures:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eprintln!("calls that failed while reconnecting: {failures:?}");
    assert!(failures.len() <= 5, "too many failures: {failures:?}");
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let scripts = counters(&mut admin).calls;
    assert!(
        scripts.get("script|load").copied().unwrap_or(0) >= 1,
        "the restarted server never got a script: {scripts:?}"
    );
}

#[tokio::test]
async fn a_store_from_an_existing_connection_loads_its_scripts_on_first_use() {
    let Some(server) = own_server() else { return };
    let url = &server.urls()[0];
    let connection = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let idem = Idempotent::new(RedisStore::from_connection(connection).with_prefix("app:"));
    let value: u32 = idem
        .execute("k", &json!({}), || async { Ok::<_, Infallible>(7) })
        .await
        .unwrap();
    assert_eq!(value, 7);
    let replayed: u32 = idem
        .execute("k", &json!({}), || async { Ok::<_, Infallible>(8) })
        .await
        .unwrap();
    assert_eq!(
        replayed, 7,
        "the second call ran the work instead of replaying"
    );
    let keys: Vec<String> = servers::query(url, redis::cmd("KEYS").arg("app:*")).unwrap();
    assert_eq!(keys.len(), 1, "one record under the prefix: {keys:?}");
}
