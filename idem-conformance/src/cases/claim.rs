//! Claiming a key: `insert` stores a record only where none is live, and
//! `load` reads what is there.

use std::time::Duration;

use idem_core::store::{Insert, Record, State, Store, Token};
use tokio::time::Instant;

use crate::support::{claim, final_record, fp, in_flight, key, live, ok, settled, LONG, RETENTION};
use crate::Factory;

/// `insert` into an absent key stores the record and returns `Inserted`.
pub async fn insert_stores_a_record_when_the_key_is_absent(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("claim-absent");
    let token = Token::random();
    claim(&*store, &key, &in_flight(token, fp(1), LONG)).await;

    let record = live(&*store, &key).await;
    assert_eq!(record.token, token, "load returned another token");
    assert_eq!(
        record.fingerprint,
        fp(1),
        "load returned another fingerprint"
    );
    assert_eq!(
        record.state,
        State::InFlight,
        "a claim must load as InFlight"
    );
    assert!(
        record.payload.is_empty(),
        "a claim's empty payload came back as {:?}",
        record.payload
    );
    assert!(
        record.lease_remaining.is_some_and(|left| !left.is_zero()),
        "a fresh claim must report lease time left, got {:?}",
        record.lease_remaining
    );
}

/// `insert` over a live record changes nothing and returns that record.
pub async fn insert_leaves_a_live_record_untouched_and_returns_it(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("claim-live");
    let first = Token::random();
    claim(&*store, &key, &in_flight(first, fp(1), LONG)).await;

    let second = Token::random();
    match ok(
        store.insert(&key, &in_flight(second, fp(2), LONG)).await,
        "insert",
    ) {
        Insert::Found(record) => {
            assert_eq!(
                record.token, first,
                "Found must carry the live record's token"
            );
            assert_eq!(
                record.fingerprint,
                fp(1),
                "Found must carry the live record's fingerprint"
            );
            assert_eq!(record.state, State::InFlight);
        }
        other => panic!("insert over a live claim must return Found, got {other:?}"),
    }
    let record = live(&*store, &key).await;
    assert_eq!(record.token, first, "insert over a live record replaced it");
    assert_eq!(
        record.fingerprint,
        fp(1),
        "insert over a live record changed it"
    );
}

/// `insert` over a completed record returns it, outcome included.
pub async fn insert_finds_a_completed_record(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    insert_finds_a_final_record(&*fixture.store(), State::Completed).await;
}

/// `insert` over a remembered failure returns it and leaves it in place:
/// a Failed record is final, like a Completed one.
pub async fn insert_finds_a_failed_record(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    insert_finds_a_final_record(&*fixture.store(), State::Failed).await;
}

async fn insert_finds_a_final_record(store: &dyn Store, state: State) {
    let key = key(&format!("claim-{state:?}"));
    let token = final_record(store, &key, state, b"{\"id\":7}").await;

    match ok(
        store
            .insert(&key, &in_flight(Token::random(), fp(1), LONG))
            .await,
        "insert",
    ) {
        Insert::Found(record) => {
            assert_eq!(record.state, state);
            assert_eq!(
                record.payload, b"{\"id\":7}",
                "Found must carry the outcome"
            );
            assert_eq!(record.token, token);
            assert_eq!(
                record.lease_remaining, None,
                "a {state:?} record has no lease"
            );
        }
        other => panic!("insert over a {state:?} record must return Found, got {other:?}"),
    }
    let record = live(store, &key).await;
    assert_eq!(
        (record.state, record.token),
        (state, token),
        "insert replaced a {state:?} record"
    );
}

/// The record `insert` finds reports the time left *now* on the store's
/// clock, for the lease and the retention, not the lengths it was written
/// with. A settled record's retention may be reported short (a lower bound,
/// as the store contract allows), never longer than the time left, and
/// `load` reports it exactly.
pub async fn found_record_reports_the_time_left_now(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let claimed = key("found-time-claimed");
    let completed = key("found-time-completed");
    let written = Instant::now();
    claim(&*store, &claimed, &in_flight(Token::random(), fp(1), LONG)).await;
    let token = Token::random();
    claim(&*store, &completed, &in_flight(token, fp(1), LONG)).await;
    let done = settled(token, fp(1), State::Completed, b"done", RETENTION);
    assert!(ok(store.swap(&completed, token, &done).await, "swap"));
    // Far above any store's clock resolution.
    let wait = Duration::from_millis(300);
    tokio::time::sleep(wait).await;

    let found = |record: Insert| match record {
        Insert::Found(record) => record,
        other => panic!("insert over a live record must return Found, got {other:?}"),
    };
    let again = in_flight(Token::random(), fp(1), LONG);
    let in_flight_found = found(ok(store.insert(&claimed, &again).await, "insert"));
    let completed_found = found(ok(store.insert(&completed, &again).await, "insert"));
    let completed_loaded = live(&*store, &completed).await;
    let elapsed = written.elapsed() + Duration::from_millis(10);
    let no_more_than_left = |left: Duration, length: Duration, what: &str, record: &Record| {
        assert!(
            !left.is_zero() && left <= length,
            "a found {:?} record reports {left:?} of its {length:?} {what} left",
            record.state
        );
        assert!(
            left + wait - Duration::from_millis(100) <= length,
            "a found {:?} record reports {left:?} of its {length:?} {what} left {wait:?} after it was written: the length it was given, not the time left",
            record.state
        );
    };
    let counted_down = |left: Duration, length: Duration, what: &str, record: &Record| {
        no_more_than_left(left, length, what, record);
        assert!(
            left + elapsed >= length,
            "a found {:?} record reports {left:?} of its {length:?} {what} left, {elapsed:?} after it was written",
            record.state
        );
    };
    let lease_left = in_flight_found
        .lease_remaining
        .unwrap_or_else(|| panic!("a found claim reports no lease: {in_flight_found:?}"));
    counted_down(lease_left, LONG, "lease", &in_flight_found);
    counted_down(
        in_flight_found.retention_remaining,
        RETENTION,
        "retention",
        &in_flight_found,
    );
    no_more_than_left(
        completed_found.retention_remaining,
        RETENTION,
        "retention",
        &completed_found,
    );
    counted_down(
        completed_loaded.retention_remaining,
        RETENTION,
        "retention",
        &completed_loaded,
    );
}

/// `load` of a key never written returns `None`.
pub async fn load_returns_none_for_an_absent_key(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    claim(
        &*store,
        &key("load-neighbour"),
        &in_flight(Token::random(), fp(1), LONG),
    )
    .await;
    for name in ["load-never-written", "load-neighbou", "load-neighbourr"] {
        assert_eq!(
            ok(store.load(&key(name)).await, "load"),
            None,
            "load of {name:?}, never written, returned a record"
        );
    }
}

/// Keys that differ only in case, a trailing space, a wildcard or a prefix
/// hold distinct records.
pub async fn distinct_keys_hold_distinct_records(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    // Raw storage keys, as a store sees them: each pair trips a common
    // backend shortcut (case-folding collation, space padding, LIKE or glob
    // patterns, prefix matching).
    let keys = [
        "k", "K", "k ", " k", "kk", "k%", "k_", "k*", "k?", "k[k]", "k\\", "k:", "k:k", "k'",
        "k\"", "1:a2:bc", "1:a1:bc", "é", "e\u{301}",
    ];
    let tokens: Vec<Token> = keys.iter().map(|_| Token::random()).collect();
    for (key, token) in keys.iter().zip(&tokens) {
        claim(&*store, key, &in_flight(*token, fp(1), LONG)).await;
    }
    for (key, token) in keys.iter().zip(&tokens) {
        assert_eq!(
            live(&*store, key).await.token,
            *token,
            "key {key:?} returned another key's record"
        );
    }
}
