//! What the conformance kit cannot see: records and deadlines that outlive
//! the process, durations too long for the clock, non-ASCII keys, and the
//! in-memory form. The contract itself is the kit's (tests/conformance.rs).

use std::time::Duration;

use idem_core::store::{Insert, Store, Token};
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

/// `count` records whose retention has passed, under keys `{prefix}{n}`.
/// Written from 16 callers at once, so the writer commits them in groups.
async fn expired(store: &SqliteStore, prefix: &str, count: usize) {
    let mut writers = tokio::task::JoinSet::new();
    for first in 0..16 {
        let (store, prefix) = (store.clone(), prefix.to_owned());
        writers.spawn(async move {
            for n in (first..count).step_by(16) {
                let key = format!("{prefix}{n}");
                let record = completed(Token::random(), b"done", Duration::from_millis(1));
                assert!(matches!(
                    store.insert(&key, &record).await.unwrap(),
                    Insert::Inserted
                ));
            }
        });
    }
    while let Some(written) = writers.join_next().await {
        written.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

#[tokio::test]
async fn a_purge_past_one_chunk_deletes_exactly_its_limit() {
    let (store, _dir, _) = fresh().await;
    let count = idem_sqlite::PURGE_CHUNK * 2 + 50;
    expired(&store, "old-", count).await;
    let first = idem_sqlite::PURGE_CHUNK * 2 + 30;
    assert_eq!(store.purge_expired(first).await.unwrap(), first);
    assert_eq!(store.purge_expired(1000).await.unwrap(), count - first);
    assert_eq!(store.purge_expired(1000).await.unwrap(), 0);
}

/// A large purge is deleted in chunks, and an operation sent while it runs
/// is served between two of them, not after the whole batch: when the
/// operation's answer comes back, expired rows are still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_sent_during_a_large_purge_are_served_between_its_chunks() {
    let (store, _dir, path) = fresh().await;
    let count = idem_sqlite::PURGE_CHUNK * 40;
    expired(&store, "old-", count).await;
    let live = completed(Token::random(), b"live", HOUR);
    store.insert("live", &live).await.unwrap();
    let purging = {
        let store = store.clone();
        tokio::spawn(async move { store.purge_expired(count).await })
    };
    // Wait for the purge's first chunk to be on its way.
    let reader = idem_sqlite::rusqlite::Connection::open(&path).unwrap();
    let left = |reader: &idem_sqlite::rusqlite::Connection| -> i64 {
        reader
            .query_row(
                "SELECT count(*) FROM idem_records WHERE key LIKE 'old-%'",
                [],
                |row| row.get(0),
            )
            .unwrap()
    };
    while left(&reader) == count as i64 {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let loaded = store.load("live").await.unwrap();
    let left_when_served = left(&reader);
    assert!(loaded.is_some());
    assert!(
        left_when_served > 0,
        "the load waited for the whole purge of {count} records"
    );
    assert_eq!(purging.await.unwrap().unwrap(), count);
    assert_eq!(left(&reader), 0);
}
