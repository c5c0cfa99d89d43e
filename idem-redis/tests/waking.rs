//! Waiters woken by the scripts' `PUBLISH`, on the shared server: a
//! waiter that polls only every hour gets its outcome at once, no wake-up
//! is lost in races, and a killed subscriber connection costs only
//! latency.

#[allow(dead_code)]
mod support;

use std::sync::Arc;

use idem_core::store::Store;
use idem_core::{Begin, Fingerprint, Idempotent};
use idem_redis::redis;
use idem_redis::RedisStore;
use idem_testing::waiting::{self, WAIT};

/// A store under a prefix of its own, and the guard that deletes its keys.
async fn store() -> Option<(RedisStore, support::Cleanup)> {
    let url = support::shared_server()?;
    let prefix = support::unique_prefix();
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap()
        .with_prefix(&prefix);
    Some((store, support::delete_prefix(&url, &prefix)))
}

#[tokio::test]
async fn a_waiter_is_woken_by_the_published_outcome() {
    let Some((store, _guard)) = store().await else {
        return;
    };
    waiting::a_waiter_is_woken_by_the_store(Arc::new(store), "woken").await;
}

#[tokio::test]
async fn no_wake_up_is_lost_in_races_between_completion_and_subscription() {
    let Some((store, _guard)) = store().await else {
        return;
    };
    let trials = std::env::var("IDEM_WAIT_RACES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let lost = waiting::lost_wake_ups_in_races(Arc::new(store), "race", trials).await;
    assert_eq!(lost, 0, "{lost} of {trials} waiters lost their wake-up");
}

#[tokio::test]
async fn a_killed_subscriber_costs_only_latency_and_comes_back() {
    let Some((store, _guard)) = store().await else {
        return;
    };
    let killer = store.clone();
    waiting::a_lost_wake_up_costs_only_latency(Arc::new(store), "lost", || async move {
        let addr = killer
            .subscriber_addr()
            .expect("the subscriber is connected");
        let client = redis::Client::open(support::redis_url()).unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ADDR")
            .arg(addr.to_string())
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(killed, 1, "the subscriber at {addr}");
    })
    .await;
}

#[tokio::test]
async fn without_notifications_nothing_is_published_and_waiters_poll() {
    let Some((store, _guard)) = store().await else {
        return;
    };
    let store = store.with_notifications(false);
    assert_eq!(store.notify_channel(), None);
    assert!(store.wakeups().is_none());
    let idem = Idempotent::new(store).with_wait(WAIT);
    let fingerprint = Fingerprint::of_bytes(b"p");
    let Begin::Run(lease) = idem.begin("k", fingerprint).await.unwrap() else {
        panic!("the key was fresh");
    };
    let waiter = tokio::spawn({
        let idem = idem.clone();
        async move { idem.begin("k", fingerprint).await }
    });
    tokio::task::yield_now().await;
    lease.complete(b"5").await.unwrap();
    match waiter.await.unwrap() {
        Ok(Begin::Replay(replay)) => assert_eq!(replay.payload(), b"5"),
        other => panic!("{other:?}"),
    }
}
