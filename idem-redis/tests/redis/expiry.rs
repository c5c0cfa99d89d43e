//! Records carry no Redis expiry: a record past its retention reads as
//! absent to every script, and `purge_expired` deletes it, and only it.

use crate::support;

use std::time::Duration;

use idem_core::store::{Insert, NewRecord, Reset, State, Store, Token};
use idem_core::Fingerprint;
use idem_redis::redis::AsyncCommands;
use idem_redis::RedisStore;

fn record(state: State, retention: Duration) -> NewRecord<'static> {
    NewRecord {
        token: Token::random(),
        fingerprint: Fingerprint::of_bytes(b"request"),
        state,
        payload: b"outcome",
        lease: (state == State::InFlight).then_some(Duration::from_secs(60)),
        retention,
    }
}

/// Polls, at most 5 s, until `key`'s record reads as absent.
async fn until_absent(store: &RedisStore, key: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while store.load(key).await.unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "{key} never lapsed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_lapsed_record_reads_as_absent_and_only_the_purge_deletes_it() {
    let Some(url) = support::shared_server() else {
        return;
    };
    let prefix = support::unique_prefix();
    let _guard = support::delete_prefix(&url, &prefix);
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap()
        .with_prefix(&prefix);
    let mut redis = idem_redis::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let short = Duration::from_millis(50);
    let done = record(State::Completed, short);
    let flying = record(State::InFlight, short);
    assert_eq!(store.insert("done", &done).await.unwrap(), Insert::Inserted);
    assert_eq!(
        store.insert("flying", &flying).await.unwrap(),
        Insert::Inserted
    );
    for key in ["done", "flying"] {
        let pttl: i64 = redis.pttl(store.redis_key(key)).await.unwrap();
        assert_eq!(pttl, -1, "{key} has a Redis expiry");
    }
    let live = record(State::Completed, Duration::from_secs(3600));
    assert_eq!(store.insert("live", &live).await.unwrap(), Insert::Inserted);
    until_absent(&store, "done").await;
    until_absent(&store, "flying").await;

    // Lapsed, still stored, and absent to every script.
    let exists: bool = redis.exists(store.redis_key("done")).await.unwrap();
    assert!(exists, "the lapsed record is kept until purged");
    assert!(!store.swap("flying", flying.token, &done).await.unwrap());
    assert!(!store
        .take_over("flying", flying.token, &done)
        .await
        .unwrap());
    assert!(!store.remove("flying", flying.token).await.unwrap());
    assert_eq!(store.reset("done").await.unwrap(), Reset::Absent);

    // The purge deletes the lapsed two, one per call at limit 1, and
    // leaves the live one.
    assert_eq!(store.purge_expired(1).await.unwrap(), 1);
    assert_eq!(store.purge_expired(10).await.unwrap(), 1);
    assert_eq!(store.purge_expired(10).await.unwrap(), 0);
    for key in ["done", "flying"] {
        let exists: bool = redis.exists(store.redis_key(key)).await.unwrap();
        assert!(!exists, "{key} was not purged");
    }
    assert_eq!(
        store.load("live").await.unwrap().map(|r| r.state),
        Some(State::Completed)
    );

    // A claim takes a lapsed key as a new one.
    assert_eq!(
        store.insert("again", &done).await.unwrap(),
        Insert::Inserted
    );
    until_absent(&store, "again").await;
    let claim = record(State::InFlight, Duration::from_secs(60));
    assert_eq!(
        store.insert("again", &claim).await.unwrap(),
        Insert::Inserted
    );
    let found = store.load("again").await.unwrap().expect("the new claim");
    assert_eq!(found.token, claim.token);
    assert!(found.lease_remaining.unwrap() > Duration::from_secs(50));
    assert!(found.retention_remaining > Duration::from_secs(50));
}

#[tokio::test]
async fn the_purge_leaves_other_data_and_earlier_layouts_alone() {
    let Some(url) = support::shared_server() else {
        return;
    };
    // A prefix with glob characters: it must match literally.
    let prefix = format!("{}[*?]:", support::unique_prefix());
    let _guard = support::delete_prefix(&url, &prefix);
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap()
        .with_prefix(&prefix);
    let mut redis = idem_redis::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis
        .set(store.redis_key("foreign"), "not a record")
        .await
        .unwrap();
    let () = redis
        .hset(store.redis_key("hash"), "field", "value")
        .await
        .unwrap();
    let mut legacy = vec![1, 1];
    legacy.extend_from_slice(&[7; 48]);
    let () = redis
        .pset_ex(store.redis_key("legacy"), legacy, 3_600_000)
        .await
        .unwrap();
    let lapsed = record(State::Completed, Duration::from_millis(1));
    store.insert("lapsed", &lapsed).await.unwrap();
    until_absent(&store, "lapsed").await;
    assert_eq!(store.purge_expired(100).await.unwrap(), 1);
    for key in ["foreign", "hash", "legacy"] {
        let exists: bool = redis.exists(store.redis_key(key)).await.unwrap();
        assert!(exists, "the purge deleted {key}");
    }
}
