//! A primary killed with SIGKILL in the middle of a storm of calls and its
//! streaming standby promoted. With the standby named in
//! `synchronous_standby_names` no key runs twice under its live lease and
//! every outcome a caller was told replays after the failover; with
//! asynchronous replication the same storm loses told outcomes, and its
//! figures are printed.
//!
//! The servers are this test's own (`idem_testing::postgres`), on free
//! ports, run as the `postgres` user when the test runs as root: a primary
//! from `initdb`, a standby from `pg_basebackup`. The standby streams from the primary through a relay
//! the test holds; before the kill the relay stops passing the primary's
//! stream, so the standby is promoted without the primary's last writes,
//! the lag replication can always have. The store reaches the primary
//! through a second relay, which the test points at the standby once it is
//! promoted (what a virtual address or a proxy does for an application).
//! Without synchronous replication the writes in the lag are told and then
//! lost (asserted, so the storm is shown to catch the hole); with it they
//! wait for the standby, and no caller is told of them. `fsync` is off on
//! both servers: a killed process loses nothing the kernel holds.
//! `IDEM_FAILOVER_TRIALS` (default 1) sets the storms per mode.

use std::time::{Duration, Instant};

use idem_core::Idempotent;
use idem_postgres::sqlx::postgres::{PgPool, PgPoolOptions};
use idem_postgres::sqlx::{self, Connection, PgConnection};
use idem_postgres::PostgresStore;
use idem_testing::postgres::PgCluster;
use idem_testing::process::free_port;
use idem_testing::relay::Relay;
use idem_testing::storm::{self, Figures, Storm};

fn url(port: u16) -> String {
    PgCluster::url(port)
}

/// One connection to the server on `port`, once it takes connections.
async fn connection(port: u16) -> PgConnection {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        match PgConnection::connect(&url(port)).await {
            Ok(connection) => return connection,
            Err(e) => assert!(Instant::now() < give_up, "port {port}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `query` (one integer out) on `connection` until it answers at
/// least `at_least`, or panics with `what` after 30 s.
async fn until(connection: &mut PgConnection, query: &str, at_least: i64, what: &str) {
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let got: Result<i64, _> = sqlx::query_scalar(query).fetch_one(&mut *connection).await;
        if got.as_ref().is_ok_and(|got| *got >= at_least) {
            return;
        }
        assert!(Instant::now() < give_up, "{what}: last answer {got:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn storm(synchronous: bool) -> Option<Figures> {
    let cluster = match PgCluster::new() {
        Ok(cluster) => cluster,
        Err(reason) => return idem_testing::skip(&reason),
    };
    let (primary_port, standby_port) = (free_port(), free_port());
    let names = if synchronous { "standby" } else { "" };
    cluster.init_primary(
        "primary",
        &format!("synchronous_commit = on\nsynchronous_standby_names = '{names}'"),
    );
    let mut primary = Some(cluster.start("primary", primary_port));
    let mut on_primary = connection(primary_port).await;

    let stream = Relay::start(primary_port).await;
    // The standby, once promoted, stands alone: it waits for nobody.
    cluster.init_standby(
        "standby",
        primary_port,
        stream.port(),
        "standby",
        "synchronous_standby_names = ''\nwal_retrieve_retry_interval = 50ms",
    );
    let _standby = cluster.start("standby", standby_port);
    let mut on_standby = connection(standby_port).await;
    until(
        &mut on_primary,
        "SELECT count(*) FROM pg_stat_replication \
         WHERE application_name = 'standby' AND state = 'streaming'",
        1,
        "the standby streams",
    )
    .await;

    let front = Relay::start(primary_port).await;
    let pool: PgPool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url(front.port()))
        .await
        .expect("the store's pool connects");
    let store = PostgresStore::from_pool(pool);
    store.migrate().await.expect("migrate");
    // The table reaches the standby before the lag begins.
    let migrated: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut on_primary)
        .await
        .unwrap();
    until(
        &mut on_primary,
        &format!(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE replay_lsn >= '{migrated}'::pg_lsn"
        ),
        1,
        "the standby replays the migration",
    )
    .await;

    // Every second run in this storm is one under a live lease.
    let idem = Idempotent::new(store).with_lease(Duration::from_secs(120));
    let storm = Storm::start(&idem, 8);
    tokio::task::block_in_place(|| {
        storm.wait(Storm::told, 300, "no calls completed before the lag");
    });
    stream.stall();
    if synchronous {
        // The commits wait for the standby, so nobody is told of them.
        until(
            &mut on_primary,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
            4,
            "no commit waits for the standby",
        )
        .await;
    } else {
        tokio::task::block_in_place(|| {
            let before = storm.told();
            storm.wait(
                Storm::told,
                before + 50,
                "no calls completed during the lag",
            );
        });
    }
    // SIGKILL, and the stream the relay held back is gone with it.
    if let Some(primary) = primary.take() {
        primary.kill();
    }
    drop(on_primary);
    stream.cut();
    let promoted: bool = sqlx::query_scalar("SELECT pg_promote(true, 60)")
        .fetch_one(&mut on_standby)
        .await
        .unwrap_or_else(|e| panic!("promote: {e}\n{}", cluster.log("standby")));
    assert!(
        promoted,
        "the standby was not promoted\n{}",
        cluster.log("standby")
    );
    front.point_to(standby_port);
    front.cut();
    storm.fault_ended();
    tokio::task::block_in_place(|| {
        storm.wait(
            Storm::told_after_fault,
            300,
            "service did not resume after the failover",
        );
    });
    let figures = storm.finish().await;
    if figures.lost_outcomes > 0 || figures.second_runs > 0 {
        eprintln!("standby's log:\n{}", cluster.log("standby"));
    }
    Some(figures)
}

const TRIALS: &str = "IDEM_FAILOVER_TRIALS";

/// With the standby named in `synchronous_standby_names`, nothing runs
/// twice and every told outcome replays after the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_synchronous_standby_a_failover_runs_nothing_twice_and_loses_no_outcome() {
    storm::trials(
        TRIALS,
        "synchronous standby",
        || storm(true),
        |f| f.assert_safe(600),
    )
    .await;
}

/// With asynchronous replication the outcomes told during the lag are
/// gone after the failover: the documented risk, made certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_asynchronous_standby_a_failover_loses_told_outcomes() {
    storm::trials(
        TRIALS,
        "asynchronous standby",
        || storm(false),
        |f| {
            f.assert_told_truly(600);
            assert!(f.lost_outcomes > 0, "the lag lost nothing: {f:?}");
        },
    )
    .await;
}
