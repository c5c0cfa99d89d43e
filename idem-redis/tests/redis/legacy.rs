//! Values written by earlier builds still replay and are taken over by the
//! scripts: layout 1 (before fingerprints had schemes) and layout 2 (a
//! later scheme), both with the retention as the key's Redis expiry. This
//! build writes layouts 3 and 4, which keep their deadlines in the value
//! and carry no expiry.

use crate::support;

use idem_core::store::{Insert, NewRecord, State, Store, Token};
use idem_core::{Fingerprint, Idempotent};
use idem_redis::redis::AsyncCommands;
use idem_redis::RedisStore;
use idem_testing::legacy;

/// A value of layout 1 exactly as earlier builds wrote it: version 1,
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

async fn setup() -> Option<(RedisStore, support::Cleanup, impl AsyncCommands + Clone)> {
    let url = support::shared_server()?;
    let prefix = support::unique_prefix();
    let guard = support::delete_prefix(&url, &prefix);
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap()
        .with_prefix(&prefix);
    let redis = idem_redis::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Some((store, guard, redis))
}

// Pins compatibility: values exactly as earlier builds wrote them, with a
// Redis expiry, replay and are taken over; what replaces them carries no
// expiry.
#[tokio::test]
async fn values_of_layouts_1_and_2_written_by_earlier_builds_still_replay() {
    let Some((store, _guard, mut redis)) = setup().await else {
        return;
    };
    {
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
        let found = store
            .load(idem.key("done").unwrap().as_str())
            .await
            .unwrap()
            .expect("the layout-1 record");
        assert!(
            found.retention_remaining > std::time::Duration::from_secs(3500)
                && found.retention_remaining <= std::time::Duration::from_secs(3600),
            "layout 1: retention left from the key's expiry: {found:?}"
        );

        legacy::check_replays(&idem, "done", "crashed").await;
        let value: Vec<u8> = redis.get(&crashed).await.unwrap();
        assert_eq!(value[0], 3, "the takeover writes layout 3");
        assert_eq!(&value[18..50], &legacy::digest()[..]);
        let pttl: i64 = redis.pttl(&crashed).await.unwrap();
        assert_eq!(pttl, -1, "a record this build writes has no expiry");
        let pttl: i64 = redis.pttl(&done).await.unwrap();
        assert!(pttl > 0, "a replay leaves the earlier record as it was");
    }

    // Layout 2: layout 1 with a fingerprint of a later scheme, its scheme
    // byte before the digest.
    let newer = Fingerprint::of_bytes(b"canonical").with_scheme(2);
    let layout_2 = |state: u8, lease_offset: Option<u64>, payload: &[u8]| {
        let mut value = vec![2, state];
        value.extend_from_slice(&[9; 16]);
        value.extend_from_slice(newer.stored());
        if let Some(offset) = lease_offset {
            value.extend_from_slice(&offset.to_be_bytes());
        }
        value.extend_from_slice(payload);
        value
    };
    let () = redis
        .pset_ex(
            store.redis_key("done2"),
            layout_2(1, None, b"out"),
            3_600_000,
        )
        .await
        .unwrap();
    let () = redis
        .pset_ex(
            store.redis_key("crashed2"),
            layout_2(0, Some(3_600_000), b""),
            3_600_000,
        )
        .await
        .unwrap();
    let claim = NewRecord {
        token: Token::random(),
        fingerprint: newer,
        state: State::InFlight,
        payload: b"",
        lease: Some(std::time::Duration::from_secs(30)),
        retention: std::time::Duration::from_secs(60),
    };
    let Insert::Found(done) = store.insert("done2", &claim).await.unwrap() else {
        panic!("the layout-2 record was not found")
    };
    assert_eq!(
        (done.token, done.fingerprint, done.state, done.payload),
        (
            Token::from_bytes([9; 16]),
            newer,
            State::Completed,
            b"out".to_vec()
        )
    );
    let Insert::Found(crashed) = store.insert("crashed2", &claim).await.unwrap() else {
        panic!("the layout-2 claim was not found")
    };
    assert!(crashed.lease_lapsed(), "{crashed:?}");
    assert!(store
        .take_over("crashed2", crashed.token, &claim)
        .await
        .unwrap());
    let value: Vec<u8> = redis.get(store.redis_key("crashed2")).await.unwrap();
    assert_eq!(value[0], 4, "the takeover writes layout 4");
}

#[tokio::test]
async fn a_later_scheme_is_written_in_layout_4_and_every_script_reads_it() {
    let Some((store, _guard, mut redis)) = setup().await else {
        return;
    };
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
    assert_eq!((value[0], value[18]), (4, 2), "layout 4, scheme 2");
    assert_eq!(value.len(), 51 + 6 + 6 + 1);
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
    let pttl: i64 = redis.pttl(store.redis_key("k")).await.unwrap();
    assert_eq!(pttl, -1, "no expiry");
}
