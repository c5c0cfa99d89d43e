//! A master under Redis Sentinel killed with SIGKILL in the middle of a
//! storm of calls, its replica promoted, the old master back as the new
//! one's replica. With [`RedisStore::with_replica_acks`] no key runs twice
//! under its live lease and every outcome a caller was told replays after
//! the failover; without it the same storm loses told outcomes, the
//! documented risk of asynchronous replication, and its figures are
//! printed.
//!
//! The servers are this test's own, on free ports: a master, one replica
//! and one Sentinel (quorum 1). With one replica the Sentinel has one
//! choice, so the test is not at the mercy of which replica it promotes.
//! The replica reaches its master through a relay the test holds: before
//! the kill the relay stops passing the master's stream, so the replica is
//! promoted without the master's last writes — the lag that asynchronous
//! replication can always have, made certain. Without replica acks those
//! writes' outcomes are lost and their keys run again (asserted, so the
//! storm is shown to catch what the option prevents); with them the writes
//! in the lag were refused, and nothing is lost or run twice.
//! `IDEM_FAILOVER_TRIALS` (default 1) sets the storms per mode.

#[allow(dead_code)]
mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use idem_core::Idempotent;
use idem_redis::RedisStore;
use idem_testing::process::{free_port, redis_server, Process};
use idem_testing::relay::Relay;
use idem_testing::storm::{self, Figures, Storm};

/// A data server on `port`, a replica of `master` when given; `promotable`
/// says whether the Sentinel may make it a master.
fn data_server(dir: &Path, port: u16, master: Option<u16>, promotable: bool) -> Process {
    let mut args: Vec<String> = [
        "--logfile",
        &format!("{port}.log"),
        // A replica that joins is copied at once, not after 5 s.
        "--repl-diskless-sync-delay",
        "0",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(master) = master {
        args.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
    }
    if !promotable {
        args.extend(["--replica-priority".into(), "0".into()]);
    }
    redis_server(dir, port, &args).expect("redis-server starts")
}

/// A Sentinel on `port` watching the master on `master` as `m`.
fn sentinel(dir: &Path, port: u16, master: u16) -> Process {
    let config = dir.join(format!("sentinel-{port}.conf"));
    std::fs::write(
        &config,
        format!(
            "port {port}\nbind 127.0.0.1\nlogfile {log}\n\
             sentinel monitor m 127.0.0.1 {master} 1\n\
             sentinel down-after-milliseconds m 300\n\
             sentinel failover-timeout m 2000\n",
            log = dir.join(format!("sentinel-{port}.log")).display(),
        ),
    )
    .unwrap();
    let child = std::process::Command::new("redis-server")
        .arg(&config)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts as a Sentinel");
    Process::from(child)
}

/// Runs `command` on the server at `port` until `done` accepts its reply.
fn until(port: u16, command: &[&str], what: &str, done: impl Fn(&redis::Value) -> bool) {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
            .and_then(|mut connection| {
                let mut cmd = redis::cmd(command[0]);
                for arg in &command[1..] {
                    cmd.arg(*arg);
                }
                cmd.query::<redis::Value>(&mut connection)
            });
        if reply.as_ref().is_ok_and(&done) {
            return;
        }
        assert!(Instant::now() < give_up, "{what}: last reply {reply:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(text) => text.clone(),
        redis::Value::Array(values) => values.iter().map(text).collect::<Vec<_>>().join(" "),
        other => format!("{other:?}"),
    }
}

/// What the Sentinel did, for the reader of a failure.
fn print_sentinel_log(dir: &Path, port: u16) {
    let log = std::fs::read_to_string(dir.join(format!("sentinel-{port}.log"))).unwrap_or_default();
    for line in log
        .lines()
        .filter(|line| line.contains(" +") || line.contains(" -"))
    {
        eprintln!("sentinel: {line}");
    }
}

async fn storm(acks: bool) -> Option<Figures> {
    if let Some(reason) = support::servers::binaries_missing() {
        return support::skip(&reason);
    }
    let dir = tempfile::tempdir().unwrap();
    let (master_port, replica_port, sentinel_port) = (free_port(), free_port(), free_port());
    let mut master = Some(data_server(dir.path(), master_port, None, true));
    let relay = Relay::start(master_port).await;
    let _replica = data_server(dir.path(), replica_port, Some(relay.port()), true);
    until(
        replica_port,
        &["INFO", "replication"],
        "the replica syncs",
        |v| text(v).contains("master_link_status:up"),
    );
    let _sentinel = sentinel(dir.path(), sentinel_port, master_port);
    let replica_seen = format!("{replica_port}");
    until(
        sentinel_port,
        &["SENTINEL", "REPLICAS", "m"],
        "the Sentinel knows the replica",
        |v| text(v).contains(&replica_seen),
    );

    let store = RedisStore::connect_sentinel([format!("redis://127.0.0.1:{sentinel_port}")], "m")
        .await
        .expect("the store finds the master");
    let store = if acks {
        store.with_replica_acks(1, Duration::from_millis(500))
    } else {
        store
    };
    // Every second run in this storm is one under a live lease.
    let idem = Idempotent::new(store).with_lease(Duration::from_secs(120));
    let storm = Storm::start(&idem, 8);
    tokio::task::block_in_place(|| {
        storm.wait(Storm::told, 300, "no calls completed before the lag");
        relay.stall();
        // Writes during the lag: told without replica acks, refused with.
        let lag_began = Instant::now();
        if acks {
            // `WAIT` holds the store's one connection, so the refusals come
            // one timeout (500 ms) after another: two show the lag.
            let before = storm.refused();
            while storm.refused() < before + 2 {
                if lag_began.elapsed() > Duration::from_secs(30) {
                    print_sentinel_log(dir.path(), sentinel_port);
                    panic!("no write refused");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        } else {
            let before = storm.told();
            storm.wait(
                Storm::told,
                before + 50,
                "no calls completed during the lag",
            );
        }
        // SIGKILL, and the stream the relay held back is gone with it.
        if let Some(master) = master.take() {
            master.kill();
        }
        relay.cut();
        let promoted = format!("{replica_port}");
        until(
            sentinel_port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"],
            "the Sentinel promotes the replica",
            |v| text(v).contains(&promoted),
        );
        storm.fault_ended();
        // The old master comes back, empty, as the new master's replica.
        // It is never promoted: a Sentinel that takes a slow answer from
        // the new master for its death (300 ms here, on a loaded machine)
        // must not fail over to a replica still copying its data.
        master = Some(data_server(
            dir.path(),
            master_port,
            Some(replica_port),
            false,
        ));
        storm.wait(
            Storm::told_after_fault,
            300,
            "service did not resume after the failover",
        );
    });
    let figures = storm.finish().await;
    drop(master);
    if figures.lost_outcomes > 0 || figures.second_runs > 0 {
        print_sentinel_log(dir.path(), sentinel_port);
    }
    Some(figures)
}

/// A field of `INFO`'s `section` on `url`.
fn info_field(url: &str, section: &str, field: &str) -> Option<String> {
    let info: String = support::servers::query(url, redis::cmd("INFO").arg(section)).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .map(|value| value.trim().to_owned())
}

/// The same storm on a Redis Cluster of three masters with one replica
/// each: one master killed with SIGKILL, its replica promoted by the
/// cluster. No relay holds a replica back here, so what asynchronous
/// replication loses is whatever the kill caught in flight, and is only
/// printed; with replica acks nothing may be lost or run twice.
async fn cluster_storm(acks: bool) -> Option<Figures> {
    if let Some(reason) = support::servers::binaries_missing() {
        return support::skip(&reason);
    }
    let cluster =
        support::servers::Servers::cluster_with_replicas(3, "--cluster-node-timeout 2000")
            .unwrap_or_else(|e| panic!("cannot start a cluster with replicas: {e}"));
    let urls = cluster.urls();
    let store = RedisStore::connect_cluster(urls.clone())
        .await
        .expect("connect to the cluster")
        .with_prefix(support::unique_prefix());
    let store = if acks {
        store.with_replica_acks(1, Duration::from_millis(500))
    } else {
        store
    };
    let idem = Idempotent::new(store).with_lease(Duration::from_secs(120));
    let storm = Storm::start(&idem, 8);
    let mut back = None;
    tokio::task::block_in_place(|| {
        storm.wait(Storm::told, 300, "no calls completed before the kill");
        let (victim, pid) = urls
            .iter()
            .find_map(|url| {
                (info_field(url, "replication", "role")? == "master")
                    .then(|| Some((url.clone(), info_field(url, "server", "process_id")?)))?
            })
            .expect("a master to kill");
        let victim_port = victim.rsplit(':').next().unwrap().to_owned();
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -KILL {pid}");
        let give_up = Instant::now() + Duration::from_secs(60);
        loop {
            // The replica that streamed from the victim now says master.
            let promoted = urls.iter().filter(|url| **url != victim).any(|url| {
                info_field(url, "replication", "role").as_deref() == Some("master")
                    && support::servers::query::<String>(url, redis::cmd("CLUSTER").arg("NODES"))
                        .is_ok_and(|nodes| {
                            nodes.lines().any(|line| {
                                line.contains(&format!(":{victim_port}@")) && line.contains("fail")
                            })
                        })
                    && info_field(url, "replication", "master_failover_state").as_deref()
                        != Some("failover-in-progress")
            });
            let masters = urls
                .iter()
                .filter(|url| info_field(url, "replication", "role").as_deref() == Some("master"))
                .count();
            if promoted && masters == 3 {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "the cluster never promoted the replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The killed node comes back, empty, as the new master's replica:
        // with replica acks, writes to its slots wait for it meanwhile.
        back = Some(
            cluster
                .restart_cluster_node(
                    victim_port.parse().unwrap(),
                    &["--cluster-node-timeout", "2000"],
                )
                .unwrap_or_else(|e| panic!("{e}")),
        );
        storm.fault_ended();
        let refused = storm.refused();
        if !storm.reached(Storm::told_after_fault, 300) {
            // Refusals that went on say the store answered (a write its
            // replica did not acknowledge); none say the calls hung.
            panic!(
                "service did not resume after the failover: {} told, {} refused in 30 s\n{}\n\
                 the restarted node's log:\n{}",
                storm.told_after_fault(),
                storm.refused() - refused,
                cluster_state(&urls),
                cluster.log_again(victim_port.parse().unwrap()),
            );
        }
    });
    let figures = storm.finish().await;
    drop(back);
    Some(figures)
}

/// Each node's replication as `INFO` tells it, and the cluster's nodes as
/// the first node that answers sees them: for the reader of a failure.
fn cluster_state(urls: &[String]) -> String {
    let mut state = String::new();
    for url in urls {
        let field = |field| info_field(url, "replication", field).unwrap_or_default();
        state += &format!(
            "{url}: role {}, master link {}, sync in progress {}, replicas {}\n",
            field("role"),
            field("master_link_status"),
            field("master_sync_in_progress"),
            field("connected_slaves"),
        );
    }
    let nodes = urls.iter().find_map(|url| {
        support::servers::query::<String>(url, redis::cmd("CLUSTER").arg("NODES")).ok()
    });
    state + &nodes.unwrap_or_default()
}

const TRIALS: &str = "IDEM_FAILOVER_TRIALS";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_with_replica_acks_a_failover_runs_nothing_twice_and_loses_no_outcome() {
    storm::trials(
        TRIALS,
        "cluster, replica acks",
        || cluster_storm(true),
        |f| f.assert_safe(600),
    )
    .await;
}

/// Reported, not asserted: what the kill caught in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_without_replica_acks_a_failover_is_counted() {
    storm::trials(
        TRIALS,
        "cluster, no replica acks",
        || cluster_storm(false),
        |f| f.assert_told_truly(600),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_acks_a_failover_runs_nothing_twice_and_loses_no_outcome() {
    storm::trials(
        TRIALS,
        "replica acks",
        || storm(true),
        |f| f.assert_safe(600),
    )
    .await;
}

/// The documented risk, made certain by the lag: outcomes told during it
/// are gone, and their keys run again under live leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replica_acks_a_failover_loses_told_outcomes() {
    storm::trials(
        TRIALS,
        "no replica acks",
        || storm(false),
        |f| {
            f.assert_told_truly(600);
            assert!(f.lost_outcomes > 0, "the lag lost nothing: {f:?}");
        },
    )
    .await;
}
