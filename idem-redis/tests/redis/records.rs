//! The record as Redis holds it, on the shared server: foreign values are
//! refused and left alone, and a completed record stays compact.

use crate::support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_core::store::{NewRecord, State, Store, StoreErrorKind, Token};
use idem_core::{Error, Fingerprint, When};
use idem_redis::redis::AsyncCommands;
use idem_redis::RedisStore;
use serde_json::json;

struct Setup {
    store: RedisStore,
    redis: idem_redis::redis::aio::MultiplexedConnection,
    _guard: support::Cleanup,
}

async fn setup() -> Option<Setup> {
    let url = support::shared_server()?;
    let prefix = support::unique_prefix();
    let store = RedisStore::connect(url.as_str())
        .await
        .expect("connect to the shared Redis")
        .with_prefix(&prefix);
    let redis = idem_redis::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("a plain connection");
    Some(Setup {
        store,
        redis,
        _guard: support::delete_prefix(&url, &prefix),
    })
}

/// Values that are not records of this layout, each named.
fn garbage() -> Vec<(&'static str, Vec<u8>)> {
    let head = |version: u8, state: u8| {
        let mut value = vec![version, state];
        value.extend_from_slice(&[7; 48]);
        value
    };
    vec![
        ("empty", Vec::new()),
        ("text", b"garbage".to_vec()),
        (
            "a future layout version",
            [head(3, 1), b"{}".to_vec()].concat(),
        ),
        ("a truncated header", head(1, 1)[..30].to_vec()),
        ("a truncated layout-2 header", head(2, 1)),
        ("an unknown state", head(1, 9)),
        (
            "in flight without its lease deadline",
            [head(1, 0), vec![1, 2, 3]].concat(),
        ),
        ("binary noise", vec![0xff; 200]),
    ]
}

fn in_flight(token: Token) -> NewRecord<'static> {
    NewRecord {
        token,
        fingerprint: Fingerprint::of_bytes(b"request"),
        state: State::InFlight,
        payload: b"",
        lease: Some(Duration::ZERO),
        retention: Duration::from_secs(60),
    }
}

fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, idem_core::store::StoreError>, what: &str) {
    match result {
        Err(error) => assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{what}: {error}"),
        Ok(value) => panic!("{what}: accepted a foreign value and returned {value:?}"),
    }
}

#[tokio::test]
async fn execute_refuses_a_foreign_value_as_corrupt_and_leaves_it_untouched() {
    let Some(mut s) = setup().await else { return };
    let idem = idem_core::Idempotent::new(s.store.clone());
    let key = s.store.redis_key(idem.key("order-1").unwrap().as_str());
    for (name, value) in garbage() {
        let () = s.redis.set(&key, &value).await.unwrap();
        let ran = AtomicBool::new(false);
        let result: Result<String, Error<Infallible>> = idem
            .execute("order-1", &json!({ "amount": 1 }), || async {
                ran.store(true, Ordering::SeqCst);
                Ok("charged".to_owned())
            })
            .await;
        match result {
            Err(Error::Store {
                source,
                when: When::BeforeWork,
            }) => {
                assert_eq!(source.kind(), StoreErrorKind::Corrupt, "{name}: {source}");
                assert!(
                    source.to_string().contains("left untouched"),
                    "{name}: the message should say what happened: {source}"
                );
            }
            other => panic!("{name}: expected a corrupt-record store error, got {other:?}"),
        }
        assert!(!ran.load(Ordering::SeqCst), "{name}: the work ran");
        let kept: Vec<u8> = s.redis.get(&key).await.unwrap();
        assert_eq!(kept, value, "{name}: the value was changed");
    }
}

#[tokio::test]
async fn every_store_method_refuses_a_foreign_value_without_changing_it() {
    let Some(mut s) = setup().await else { return };
    let key = "k";
    let redis_key = s.store.redis_key(key);
    for (name, value) in garbage() {
        let () = s.redis.set(&redis_key, &value).await.unwrap();
        let token = Token::random();
        assert_corrupt(s.store.insert(key, &in_flight(token)).await, name);
        assert_corrupt(s.store.load(key).await, name);
        assert_corrupt(s.store.swap(key, token, &in_flight(token)).await, name);
        assert_corrupt(s.store.take_over(key, token, &in_flight(token)).await, name);
        assert_corrupt(s.store.remove(key, token).await, name);
        let kept: Vec<u8> = s.redis.get(&redis_key).await.unwrap();
        assert_eq!(kept, value, "{name}: the value was changed");
    }
}

#[tokio::test]
async fn a_key_holding_another_redis_type_is_refused_as_corrupt() {
    let Some(mut s) = setup().await else { return };
    let idem = idem_core::Idempotent::new(s.store.clone());
    let key = s.store.redis_key(idem.key("order-2").unwrap().as_str());
    let () = s.redis.hset(&key, "field", "value").await.unwrap();
    let result: Result<String, Error<Infallible>> = idem
        .execute("order-2", &json!({}), || async { Ok("ran".to_owned()) })
        .await;
    match result {
        Err(Error::Store { source, .. }) => {
            assert_eq!(source.kind(), StoreErrorKind::Corrupt, "{source}")
        }
        other => panic!("expected a corrupt-record store error, got {other:?}"),
    }
    let kind: String = idem_redis::redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut s.redis)
        .await
        .unwrap();
    assert_eq!(kind, "hash", "the hash was replaced");
}

#[tokio::test]
async fn a_completed_record_costs_at_most_64_bytes_more_than_its_bare_outcome() {
    let Some(mut s) = setup().await else { return };
    let idem = idem_core::Idempotent::new(s.store.clone());
    let outcome = "x".repeat(98);
    let payload = serde_json::to_vec(&outcome).unwrap();
    assert_eq!(payload.len(), 100, "the outcome must encode to 100 bytes");
    let _: String = idem
        .execute("receipt", &json!({ "amount": 1 }), || async {
            Ok::<_, Infallible>(outcome.clone())
        })
        .await
        .unwrap();
    let key = s.store.redis_key(idem.key("receipt").unwrap().as_str());
    let usage = |redis: &mut idem_redis::redis::aio::MultiplexedConnection| {
        let mut cmd = idem_redis::redis::cmd("MEMORY");
        cmd.arg("USAGE").arg(&key).arg("SAMPLES").arg(0);
        let mut redis = redis.clone();
        async move { cmd.query_async::<i64>(&mut redis).await.unwrap() }
    };
    let record = usage(&mut s.redis).await;
    let () = idem_redis::redis::cmd("SET")
        .arg(&key)
        .arg(&payload)
        .arg("KEEPTTL")
        .query_async(&mut s.redis)
        .await
        .unwrap();
    let bare = usage(&mut s.redis).await;
    eprintln!("MEMORY USAGE: record {record} bytes, bare 100-byte string {bare} bytes");
    assert!(
        record - bare <= 64,
        "a completed record takes {record} bytes, {} more than the bare outcome's {bare}",
        record - bare
    );
}

#[tokio::test]
async fn a_resent_call_whose_first_attempt_was_applied_still_succeeds() {
    // Pins retry safety: a cluster client resends a request after a
    // timeout, so each operation may reach the server twice.
    let Some(s) = setup().await else { return };
    let (owner, recoverer) = (Token::random(), Token::random());
    let claim = NewRecord {
        lease: Some(Duration::from_secs(30)),
        ..in_flight(owner)
    };
    for attempt in ["first", "resent"] {
        let inserted = s.store.insert("k", &claim).await.unwrap();
        assert_eq!(
            inserted,
            idem_core::store::Insert::Inserted,
            "{attempt} insert"
        );
    }
    let lapsed = NewRecord {
        lease: Some(Duration::ZERO),
        ..in_flight(owner)
    };
    assert!(s.store.swap("k", owner, &lapsed).await.unwrap());
    let taken = NewRecord {
        lease: Some(Duration::from_secs(30)),
        ..in_flight(recoverer)
    };
    for attempt in ["first", "resent"] {
        let took = s.store.take_over("k", owner, &taken).await.unwrap();
        assert!(took, "{attempt} take_over");
    }
    let completed = NewRecord {
        state: State::Completed,
        payload: b"outcome",
        lease: None,
        ..in_flight(recoverer)
    };
    for attempt in ["first", "resent"] {
        let swapped = s.store.swap("k", recoverer, &completed).await.unwrap();
        assert!(swapped, "{attempt} completion");
    }
    let record = s.store.load("k").await.unwrap().expect("the record");
    assert_eq!(
        (record.state, record.payload),
        (State::Completed, b"outcome".to_vec())
    );
    // A different value under the same token is not mistaken for a resend.
    let other = NewRecord {
        payload: b"another outcome",
        ..completed
    };
    assert!(!s.store.swap("k", recoverer, &other).await.unwrap());
}
