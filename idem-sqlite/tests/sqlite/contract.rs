//! What the conformance kit cannot see: records and deadlines that outlive
//! the process, durations too long for the clock, non-ASCII keys, and the
//! in-memory form. The contract itself is the kit's (tests/conformance.rs).

use std::time::Duration;

use idem_core::{Insert, Store, Token};
use idem_sqlite::SqliteStore;

use crate::support::{completed, fresh, in_flight};

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn records_and_leases_survive_reopening_the_file() {
    let (store, _dir, path) = fresh().await;
    let token = Token::random();
    store
        .insert("done", &in_flight(token, MINUTE, HOUR))
        .await
        .unwrap();
    assert!(store
        .swap("done", token, &completed(token, b"kept", HOUR))
        .await
        .unwrap());
    let holder = Token::random();
    store
        .insert("held", &in_flight(holder, MINUTE, HOUR))
        .await
        .unwrap();
    drop(store);

    let store = SqliteStore::open(&path).await.expect("the file reopens");
    assert_eq!(
        store.load("done").await.unwrap().expect("kept").payload,
        b"kept"
    );
    let held = store.load("held").await.unwrap().expect("kept");
    assert_eq!(held.token, holder);
    let lease = held.lease_remaining.expect("an in-flight lease");
    assert!(
        lease > MINUTE - Duration::from_secs(10),
        "a lease outlives a restart: {lease:?}"
    );
    let taker = in_flight(Token::random(), MINUTE, HOUR);
    assert!(
        !store.take_over("held", holder, &taker).await.unwrap(),
        "and still fences"
    );
}

#[tokio::test]
async fn durations_too_long_to_add_are_kept_for_a_century() {
    let (store, _dir, _) = fresh().await;
    let token = Token::random();
    let forever = in_flight(token, Duration::MAX, Duration::MAX);
    assert_eq!(store.insert("k", &forever).await.unwrap(), Insert::Inserted);
    let record = store.load("k").await.unwrap().expect("live");
    let century = Duration::from_secs(99 * 365 * 24 * 3600);
    assert!(record.lease_remaining.expect("a lease") > century);
    assert!(record.retention_remaining > century);
}

#[tokio::test]
async fn keys_beyond_ascii_are_kept_apart_byte_for_byte() {
    let (store, _dir, _) = fresh().await;
    // Distinct to SQLite's default BINARY collation, whatever a case-folding
    // or normalising comparison would say.
    let keys = ["é", "e\u{301}", "É", "ß", "ss", &"é".repeat(400)];
    for key in keys {
        store
            .insert(key, &in_flight(Token::random(), MINUTE, HOUR))
            .await
            .unwrap();
    }
    for key in keys {
        let token = store.load(key).await.unwrap().expect("live").token;
        let again = store
            .insert(key, &in_flight(Token::random(), MINUTE, HOUR))
            .await;
        match again.unwrap() {
            Insert::Found(found) => assert_eq!(found.token, token, "{key:?}"),
            Insert::Inserted => panic!("{key:?} was lost"),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_in_memory_store_keeps_records_while_it_lives() {
    let store = SqliteStore::open_in_memory().await.expect("opens");
    assert_eq!(store.path(), None);
    let token = Token::random();
    store
        .insert("k", &in_flight(token, MINUTE, HOUR))
        .await
        .unwrap();
    assert!(store
        .swap("k", token, &completed(token, b"v", HOUR))
        .await
        .unwrap());
    assert_eq!(store.load("k").await.unwrap().expect("live").payload, b"v");
}
