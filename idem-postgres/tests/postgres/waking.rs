//! Waiters woken by `LISTEN`/`NOTIFY`, counted on the real server: a
//! waiter that polls only every hour gets its outcome at once, also from a
//! transactional completion, and still gets it when its listener
//! connection is killed.

use std::sync::Arc;

use idem_core::store::Store;
use idem_core::{Begin, Fingerprint, Idempotent};
use idem_postgres::sqlx::{self, Connection};
use idem_postgres::PostgresStore;
use idem_testing::waiting::{self, CountingStore, NO_POLLING, WAIT, WOKEN};

use crate::support;

/// Kills the listener connection of `store` from the server side.
async fn kill_listener(store: &PostgresStore) {
    let channel = store.notify_channel().unwrap().to_owned();
    let mut admin = sqlx::PgConnection::connect(&support::url()).await.unwrap();
    let (killed,): (i64,) = sqlx::query_as(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE query = 'LISTEN \"' || $1 || '\"'",
    )
    .bind(&channel)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(killed, 1, "one listener connection on {channel}");
}

#[tokio::test]
async fn a_waiter_is_woken_by_notify() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let store = store.with_notifications(true);
    waiting::a_waiter_is_woken_by_the_store(Arc::new(store), "woken").await;
}

#[tokio::test]
async fn no_wake_up_is_lost_in_races_between_completion_and_listening() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let store = store.with_notifications(true);
    let trials = std::env::var("IDEM_WAIT_RACES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let lost = waiting::lost_wake_ups_in_races(Arc::new(store), "race", trials).await;
    assert_eq!(lost, 0, "{lost} of {trials} waiters lost their wake-up");
}

#[tokio::test]
async fn a_killed_listener_costs_only_latency_and_comes_back() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let store = store.with_notifications(true);
    let killer = store.clone();
    waiting::a_lost_wake_up_costs_only_latency(Arc::new(store), "lost", || async move {
        kill_listener(&killer).await;
    })
    .await;
}

#[tokio::test]
async fn a_transactional_completion_wakes_waiters_at_commit() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let store = store.with_notifications(true);
    let counting = CountingStore::new(Arc::new(store.clone()));
    waiting::connected_wakeups(&counting).await;
    let idem = Idempotent::new(counting.clone()).with_wait_polling(NO_POLLING, NO_POLLING);
    let fingerprint = Fingerprint::of_bytes(b"tx");
    let Begin::Run(lease) = idem.begin("k", fingerprint).await.unwrap() else {
        panic!("the key was fresh");
    };
    let waiter = tokio::spawn({
        let idem = idem.clone().with_wait(WAIT);
        async move { idem.begin("k", fingerprint).await }
    });
    waiting::until("the waiter is parked", || counting.answered() == 3).await;
    let mut tx = store.pool().begin().await.unwrap();
    let done = store.complete_in(&mut tx, lease, b"21").await.unwrap();
    done.commit(tx.commit()).await.unwrap();
    let answer = tokio::time::timeout(WOKEN, waiter)
        .await
        .expect("the commit woke the waiter");
    match answer.unwrap() {
        Ok(Begin::Replay(replay)) => assert_eq!(replay.payload(), b"21"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn without_notifications_no_listener_is_started_and_waiters_poll() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    // Off is the default, and turning it off again keeps it off.
    assert_eq!(store.notify_channel(), None);
    let store = store.with_notifications(true).with_notifications(false);
    assert_eq!(store.notify_channel(), None);
    assert!(store.wakeups().is_none());
    let idem = Idempotent::new(store.clone()).with_wait(WAIT);
    let Begin::Run(lease) = idem.begin("k", Fingerprint::of_bytes(b"p")).await.unwrap() else {
        panic!("the key was fresh");
    };
    let waiter = tokio::spawn({
        let idem = idem.clone();
        async move { idem.begin("k", Fingerprint::of_bytes(b"p")).await }
    });
    tokio::task::yield_now().await;
    lease.complete(b"5").await.unwrap();
    match waiter.await.unwrap() {
        Ok(Begin::Replay(replay)) => assert_eq!(replay.payload(), b"5"),
        other => panic!("{other:?}"),
    }
}
