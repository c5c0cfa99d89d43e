//! Bytes in a store that are not a valid record, written with the store's
//! own client: a clear error, never a panic, never a replay of garbage, and
//! the key is not silently reset. Also a well-formed record whose outcome
//! is not JSON: a `Decode` error, never a replay.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Insert, NewRecord, State, Store, StoreErrorKind, Token};
use idem_core::{Error, Fingerprint, Idempotent};
use idem_faults::{postgres_url, redis_url, unique_name};

/// Runs `execute` on a damaged key and checks it refuses without running.
async fn refuses_damaged(idem: &Idempotent, key: &str, label: &str) {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let out: Result<String, Error<String>> = idem
        .execute(key, "body", || async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok("ran".to_owned())
        })
        .await;
    match out {
        Err(Error::Store { ref source, .. }) if source.kind() == StoreErrorKind::Corrupt => {}
        Err(Error::Decode(_)) => {}
        other => panic!("{label}: a damaged record must be refused, got {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "{label}: the work ran on a damaged key"
    );
}

/// A well-formed `Completed` record whose payload is not JSON replays as a
/// `Decode` error on every store.
async fn undecodable_outcome_is_a_decode_error(store: Arc<dyn Store>) {
    let idem = Idempotent::from_arc(store.clone());
    let key = idem.key("not-json").unwrap();
    let written = store
        .insert(
            key.as_str(),
            &NewRecord {
                token: Token::random(),
                fingerprint: Fingerprint::of_json("body").unwrap(),
                state: State::Completed,
                payload: b"\xff\xfe not json",
                lease: None,
                retention: Duration::from_secs(60),
            },
        )
        .await
        .unwrap();
    assert_eq!(written, Insert::Inserted);
    let out: Result<String, Error<String>> = idem
        .execute("not-json", "body", || async { Ok("ran".into()) })
        .await;
    assert!(matches!(out, Err(Error::Decode(_))), "{out:?}");
}

#[tokio::test]
async fn redis_values_that_are_not_records_are_refused_and_kept() {
    use idem_redis::redis::AsyncCommands;
    let Some(url) = redis_url() else { return };
    let prefix = format!("{}:", unique_name("bad"));
    let store = idem_redis::RedisStore::connect(url.as_str())
        .await
        .unwrap()
        .with_prefix(prefix.clone());
    let idem = Idempotent::new(store.clone());
    let client = idem_redis::redis::Client::open(url.as_str()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();

    let good = {
        let _: String = idem
            .execute("good", "body", || async {
                Ok::<_, String>("x".repeat(100))
            })
            .await
            .unwrap();
        let bytes: Vec<u8> = raw
            .get(store.redis_key(idem.key("good").unwrap().as_str()))
            .await
            .unwrap();
        bytes
    };
    let mut wrong_version = good.clone();
    wrong_version[0] = wrong_version[0].wrapping_add(77);
    let damaged: [(&str, Vec<u8>); 5] = [
        ("truncated", good[..good.len().min(20)].to_vec()),
        ("wrong-version", wrong_version),
        ("garbage", b"\x00\x01garbage that is no record".to_vec()),
        ("empty", Vec::new()),
        ("text", b"OK".to_vec()),
    ];
    for (label, bytes) in damaged {
        let redis_key = store.redis_key(idem.key(label).unwrap().as_str());
        let _: () = raw.set_ex(&redis_key, &bytes, 600).await.unwrap();
        refuses_damaged(&idem, label, label).await;
        let kept: Vec<u8> = raw.get(&redis_key).await.unwrap();
        assert_eq!(kept, bytes, "{label}: the damaged value was reset");
    }
    undecodable_outcome_is_a_decode_error(Arc::new(store)).await;
    let keys: Vec<Vec<u8>> = raw.keys(format!("{prefix}*")).await.unwrap();
    let _: () = raw.del(keys).await.unwrap();
}

#[tokio::test]
async fn postgres_rows_that_do_not_decode_are_refused_and_kept() {
    let Some(url) = postgres_url() else { return };
    let table = unique_name("bad");
    let store = idem_postgres::PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    let idem = Idempotent::new(store.clone());
    let damage = [
        ("short-token", "token = '\\x0102'::bytea"),
        ("short-fingerprint", "fingerprint = '\\x00'::bytea"),
        ("unknown-state", "state = 9"),
        ("negative-state", "state = -1"),
    ];
    for (label, set) in damage {
        let _: String = idem
            .execute(label, "body", || async { Ok::<_, String>("ok".into()) })
            .await
            .unwrap();
        let key = idem.key(label).unwrap();
        idem_postgres::sqlx::query(&format!("UPDATE {table} SET {set} WHERE key = $1"))
            .bind(key.as_str())
            .execute(&pool)
            .await
            .unwrap();
        let before: (Vec<u8>, Vec<u8>, i16) = idem_postgres::sqlx::query_as(&format!(
            "SELECT token, fingerprint, state FROM {table} WHERE key = $1"
        ))
        .bind(key.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
        refuses_damaged(&idem, label, label).await;
        let after: (Vec<u8>, Vec<u8>, i16) = idem_postgres::sqlx::query_as(&format!(
            "SELECT token, fingerprint, state FROM {table} WHERE key = $1"
        ))
        .bind(key.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(before, after, "{label}: the damaged row was reset");
    }
    undecodable_outcome_is_a_decode_error(Arc::new(store)).await;
    idem_postgres::sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}
