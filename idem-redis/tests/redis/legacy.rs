//! Values written before fingerprints had schemes (record layout 1) still
//! replay and are taken over by the scripts; a later scheme is written in
//! layout 2, which every script reads too.

use crate::support;

use idem_core::store::{NewRecord, State, Store, Token};
use idem_core::{Fingerprint, Idempotent};
use idem_redis::redis::AsyncCommands;
use idem_redis::RedisStore;
use idem_testing::legacy;

/// A value in layout 1 exactly as earlier builds wrote it: version 1,
/// state, token, the 32-byte fingerprint, for in-flight records the lease
/// deadline as ms before expiry, then the payload.
fn layout_1(state: u8, lease_offset: Option<u64>, payload: &[u8]) -> Vec<u8> {
    let mut value = vec![1, state];
    value.extend_from_slice(&[7; 16]);
    value.extend_from_slice(&legacy::digest());
    if let Some(offset) = lease_offset {
        value.extend_from_slice(&offset.to_be_bytes());
    }
    value.extend_from_slice(payload);
    value
}

// Pins compatibility: values exactly as earlier builds wrote them replay.
#[tokio::test]
async fn values_written_before_fingerprint_schemes_still_replay() {
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
    let idem = Idempotent::new(store.clone());
    let done = store.redis_key(idem.key("done").unwrap().as_str());
    let crashed = store.redis_key(idem.key("crashed").unwrap().as_str());
    let () = redis
        .pset_ex(&done, layout_1(1, None, legacy::PAYLOAD), 3_600_000)
        .await
        .unwrap();
    // Retention 1 h, lease already over: the deadline is the whole
    // retention before expiry.
    let () = redis
        .pset_ex(&crashed, layout_1(0, Some(3_600_000), b""), 3_600_000)
        .await
        .unwrap();

    legacy::check_replays(&idem, "done", "crashed").await;
    let value: Vec<u8> = redis.get(&crashed).await.unwrap();
    assert_eq!(
        value[0], 1,
        "a scheme-1 record is still written in layout 1"
    );
    assert_eq!(&value[18..50], &legacy::digest()[..]);
}

#[tokio::test]
async fn a_later_scheme_is_written_in_layout_2_and_every_script_reads_it() {
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
    let fingerprint = Fingerprint::of_bytes(b"request").with_scheme(2);
    let record = |token, state, lease| NewRecord {
        token,
        fingerprint,
        state,
        payload: b"p",
        lease,
        retention: std::time::Duration::from_secs(60),
    };
    let (a, b) = (Token::random(), Token::random());
    let lapsed = record(a, State::InFlight, Some(std::time::Duration::ZERO));
    store.insert("k", &lapsed).await.unwrap();
    let value: Vec<u8> = redis.get(store.redis_key("k")).await.unwrap();
    assert_eq!((value[0], value[18]), (2, 2), "layout 2, scheme 2");
    assert_eq!(value.len(), 51 + 8 + 1);
    let live = record(b, State::InFlight, Some(std::time::Duration::from_secs(30)));
    assert!(store.take_over("k", a, &live).await.unwrap());
    assert!(!store.take_over("k", b, &live).await.unwrap(), "live lease");
    assert!(store.swap("k", b, &live).await.unwrap(), "renewal");
    assert!(!store.remove("k", a).await.unwrap(), "stale token");
    let completed = record(b, State::Completed, None);
    assert!(store.swap("k", b, &completed).await.unwrap());
    let found = store.load("k").await.unwrap().unwrap();
    assert_eq!(
        (found.fingerprint, found.state, found.payload),
        (fingerprint, State::Completed, b"p".to_vec())
    );
}
