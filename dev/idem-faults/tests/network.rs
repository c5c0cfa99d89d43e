//! A network that lies, between each server store and its server: a relay
//! the test holds (`idem_testing::relay`) adds latency and jitter, starves
//! the bandwidth, resets connections in the middle of replies, makes them
//! half-open (requests arrive, no answer comes back) and partitions client
//! from server, one fault after another during one storm of calls. Through
//! all of it no key runs twice under its lease, every failed call is a
//! store error whose `When` says truly whether its work ran, every outcome
//! a caller was told replays, and after each fault ends the same store
//! serves again (counted per fault). An owner cut off by a partition
//! longer than its lease is told `LeaseLost` once it heals, never its
//! outcome.
//!
//! The SQL stores run with 2 s statement timeouts here (10 s by default),
//! Redis with its 500 ms reply timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::store::Store;
use idem_core::{Error, Idempotent};
use idem_faults::unique_name;
use idem_mysql::MySqlStore;
use idem_postgres::PostgresStore;
use idem_redis::RedisStore;
use idem_testing::relay::Relay;
use idem_testing::storm::Storm;
use idem_testing::{Server, StoreKind, TestStore};

/// What one fault did: outcomes told and calls failed while it lasted.
struct Seen {
    fault: &'static str,
    told: usize,
    failed: usize,
    took: Duration,
}

/// Runs `fault` (which returns once the fault has shown itself), then
/// `end`, then waits for 100 more outcomes: service resumed.
fn phase(
    storm: &Storm,
    fault: &'static str,
    start: impl FnOnce(),
    hold: impl FnOnce(),
    end: impl FnOnce(),
) -> Seen {
    let (told, failed, began) = (storm.told(), storm.refused(), Instant::now());
    start();
    hold();
    end();
    let seen = Seen {
        fault,
        told: storm.told() - told,
        failed: storm.refused() - failed,
        took: began.elapsed(),
    };
    let resumed = storm.told();
    storm.wait(
        Storm::told,
        resumed + 100,
        &format!("service did not resume after {fault}"),
    );
    seen
}

fn through(url: &str, relay: &Relay) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, host_port)) => (format!("{user}@"), host_port),
        None => (String::new(), authority),
    };
    let host = host_port.split(':').next().unwrap_or(host_port);
    format!("{scheme}://{user}{host}:{}/{path}", relay.port())
}

/// The store `kind` at `url`, in `scope`; the SQL stores' statements
/// bounded to 2 s, so a half-open connection fails its call soon.
async fn open(kind: StoreKind, url: &str, scope: &str) -> Arc<dyn Store> {
    let timeout = Duration::from_secs(2);
    match kind {
        StoreKind::Redis => Arc::new(
            RedisStore::connect(url)
                .await
                .expect("Redis through the relay")
                .with_prefix(format!("{scope}:")),
        ),
        StoreKind::Postgres => {
            let store = PostgresStore::connect(url)
                .await
                .expect("PostgreSQL through the relay")
                .with_table(scope)
                .unwrap()
                .with_statement_timeout(timeout);
            store.migrate().await.expect("migrate");
            Arc::new(store)
        }
        StoreKind::MySql => {
            let store = MySqlStore::connect(url)
                .await
                .expect("MariaDB through the relay")
                .with_table(scope)
                .unwrap()
                .with_statement_timeout(timeout);
            store.migrate().await.expect("migrate");
            Arc::new(store)
        }
        other => panic!("{} has no server", other.name()),
    }
}

/// A store's server and a relay in front of it: the server's URL, the URL
/// through the relay, a fresh scope and the guard that removes it.
struct Relayed {
    url: String,
    through: String,
    relay: Relay,
    scope: String,
    _guard: idem_testing::Cleanup,
}

/// The server of `kind` behind a new relay, or `None` (skipped) when the
/// server is not there.
async fn relayed(kind: StoreKind, what: &str) -> Option<Relayed> {
    let server: Server = kind.server().expect("a server store");
    let url = server.require()?;
    let port: u16 = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next()?.parse().ok())
        .unwrap_or(server.default_port());
    let relay = Relay::start(port).await;
    let scope = unique_name(what);
    let guard = server.cleanup(&url, kind.isolation(), &scope);
    Some(Relayed {
        through: through(&url, &relay),
        url,
        relay,
        scope,
        _guard: guard,
    })
}

async fn on(kind: StoreKind) {
    let Some(relayed) = relayed(kind, "network").await else {
        return;
    };
    let relay = &relayed.relay;
    let store = open(kind, &relayed.through, &relayed.scope).await;
    // Every second run in this storm is one under a live lease.
    let idem = Idempotent::from_arc(store).with_lease(Duration::from_secs(120));
    let storm = Storm::start(&idem, 8);
    let seen = tokio::task::block_in_place(|| {
        storm.wait(Storm::told, 200, "no calls completed before the faults");
        let mut seen = Vec::new();
        seen.push(phase(
            &storm,
            "latency 20 ms and jitter 20 ms",
            || relay.delay(Duration::from_millis(20), Duration::from_millis(20)),
            || storm.wait(Storm::told, storm.told() + 50, "no calls completed slowly"),
            || relay.delay(Duration::ZERO, Duration::ZERO),
        ));
        seen.push(phase(
            &storm,
            "bandwidth starved to 4 KiB/s",
            || relay.starve(Some(4096)),
            || storm.wait(Storm::told, storm.told() + 10, "no calls completed starved"),
            || relay.starve(None),
        ));
        seen.push(phase(
            &storm,
            "20 replies reset halfway",
            || relay.reset_replies(20),
            || {
                let give_up = Instant::now() + Duration::from_secs(30);
                while relay.resets_left() > 0 {
                    assert!(Instant::now() < give_up, "replies left unreset");
                    std::thread::sleep(Duration::from_millis(5));
                }
            },
            || {},
        ));
        seen.push(phase(
            &storm,
            "half-open connections",
            || relay.stall(),
            || {
                let failed = storm.refused();
                storm.wait(
                    Storm::refused,
                    failed + 8,
                    "no call failed on a half-open connection",
                );
            },
            || relay.unstall(),
        ));
        seen.push(phase(
            &storm,
            "a partition of 2 s",
            || relay.partition(),
            || std::thread::sleep(Duration::from_secs(2)),
            || relay.heal(),
        ));
        seen
    });
    let figures = storm.finish().await;
    for seen in &seen {
        eprintln!(
            "{}: {}: {} told and {} failed in {:?}",
            kind.name(),
            seen.fault,
            seen.told,
            seen.failed,
            seen.took
        );
    }
    eprintln!("{}: {figures:?}", kind.name());
    assert!(
        seen[2].failed > 0,
        "{}: no reset failed a call",
        kind.name()
    );
    assert_eq!(figures.wrong_when, 0, "{}: {figures:?}", kind.name());
    assert_eq!(
        figures.second_runs,
        0,
        "{}: a key ran twice: {figures:?}",
        kind.name()
    );
    assert_eq!(
        figures.lost_outcomes,
        0,
        "{}: an outcome was lost: {figures:?}",
        kind.name()
    );
}

/// An owner cut off by a partition longer than its 1 s lease, while its
/// work runs: another process, reaching the server directly, takes the
/// key over once the lease lapsed on the server; after the partition heals
/// and the work ends, the owner is told `LeaseLost`, never its outcome,
/// and the record keeps the new owner's.
async fn partitioned_owner(kind: StoreKind) {
    let Some(relayed) = relayed(kind, "partitioned").await else {
        return;
    };
    let relay = &relayed.relay;
    let lease = Duration::from_secs(1);
    let owner =
        Idempotent::from_arc(open(kind, &relayed.through, &relayed.scope).await).with_lease(lease);
    let other =
        Idempotent::from_arc(open(kind, &relayed.url, &relayed.scope).await).with_lease(lease);
    let (started, began) = tokio::sync::oneshot::channel();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let owner_call = tokio::spawn(async move {
        owner
            .execute("k", "k", || async move {
                let _ = started.send(());
                let _ = finished.await;
                Ok::<_, String>("owner".to_owned())
            })
            .await
    });
    began.await.expect("the owner's work starts");
    relay.partition();
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut refused = 0;
    loop {
        let taken: Result<String, Error<String>> = other
            .execute("k", "k", || async { Ok("other".to_owned()) })
            .await;
        match taken {
            Ok(outcome) => {
                assert_eq!(outcome, "other");
                break;
            }
            Err(Error::InProgress { .. }) => refused += 1,
            Err(error) => panic!("{}: {error}", kind.name()),
        }
        assert!(
            Instant::now() < give_up,
            "{}: never taken over",
            kind.name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.heal();
    finish.send(()).expect("the owner's work waits");
    let told = owner_call.await.expect("the owner's call");
    eprintln!(
        "{}: {refused} refusals before the takeover; the owner was told {told:?}",
        kind.name()
    );
    assert!(refused > 0, "{}: the key was never in flight", kind.name());
    assert!(
        matches!(told, Err(Error::LeaseLost)),
        "{}: the owner cut off was told {told:?}",
        kind.name()
    );
    let replay: Result<String, Error<String>> = other
        .execute("k", "k", || async { Ok("again".to_owned()) })
        .await;
    assert_eq!(replay.ok().as_deref(), Some("other"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_past_its_lease_is_told_lease_lost() {
    tokio::join!(
        partitioned_owner(StoreKind::Redis),
        partitioned_owner(StoreKind::Postgres),
        partitioned_owner(StoreKind::MySql),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_through_a_lying_network() {
    on(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_through_a_lying_network() {
    on(StoreKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_through_a_lying_network() {
    on(StoreKind::MySql).await;
}
