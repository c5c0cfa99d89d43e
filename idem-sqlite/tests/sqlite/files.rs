//! Files the store must refuse, rows it must not trust, and a schema it may
//! set up any number of times.

use std::time::Duration;

use idem_core::store::{Insert, Store, StoreErrorKind, Token};
use idem_sqlite::rusqlite::{params, Connection};
use idem_sqlite::SqliteStore;

use crate::support::{completed, fresh, in_flight};

const HOUR: Duration = Duration::from_secs(3600);

async fn refusal(path: &std::path::Path) -> idem_core::store::StoreError {
    SqliteStore::open(path)
        .await
        .expect_err("the file must be refused")
}

#[tokio::test]
async fn a_table_of_the_same_name_with_other_columns_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE idem_records (id INTEGER PRIMARY KEY, name TEXT);")
        .unwrap();
    let error = refusal(&path).await;
    assert_eq!(error.kind(), StoreErrorKind::Config);
    let message = error.to_string();
    assert!(
        message.contains("idem_records") && message.contains("did not create"),
        "{message}"
    );
    assert!(message.contains("id INTEGER, name TEXT"), "{message}");
    // The foreign table is left as it was.
    let columns: i64 = conn
        .query_row(
            "SELECT count(*) FROM pragma_table_info('idem_records')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(columns, 2);
}

#[tokio::test]
async fn a_view_of_the_same_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE VIEW idem_records AS SELECT 1 AS key;")
        .unwrap();
    assert_eq!(refusal(&path).await.kind(), StoreErrorKind::Config);
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "these are notes, not a database\n".repeat(200)).unwrap();
    let error = refusal(&path).await;
    assert_eq!(error.kind(), StoreErrorKind::Config);
    assert!(
        error.to_string().contains("is not a SQLite database"),
        "{error}"
    );
    assert!(
        std::error::Error::source(&error).is_some(),
        "the cause is kept"
    );
    let untouched = std::fs::read_to_string(&path).unwrap();
    assert!(untouched.starts_with("these are notes"));
}

#[tokio::test]
async fn a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(refusal(dir.path()).await.kind(), StoreErrorKind::Config);
}

#[tokio::test]
async fn opening_and_migrating_again_keeps_the_records() {
    let (store, _dir, path) = fresh().await;
    let token = Token::random();
    store
        .insert("k", &in_flight(token, HOUR, HOUR))
        .await
        .unwrap();
    store.migrate().await.expect("migrating twice is harmless");
    let second = SqliteStore::open(&path)
        .await
        .expect("a second store opens");
    second.migrate().await.unwrap();
    assert_eq!(second.load("k").await.unwrap().expect("kept").token, token);
}

/// Writes a row the store could never have written, behind its back.
fn plant(path: &std::path::Path, key: &str, token: &[u8], fingerprint: &[u8], state: i64) {
    Connection::open(path)
        .unwrap()
        .execute(
            "INSERT INTO idem_records VALUES (?1, ?2, ?3, ?4, x'', NULL, ?5)",
            params![key, token, fingerprint, state, i64::MAX],
        )
        .unwrap();
}

#[tokio::test]
async fn rows_that_do_not_decode_are_corrupt_errors_not_panics() {
    let (store, _dir, path) = fresh().await;
    plant(&path, "short-token", &[1; 15], &[0; 32], 1);
    plant(&path, "short-fingerprint", &[1; 16], &[0; 31], 1);
    plant(&path, "unknown-state", &[1; 16], &[0; 32], 7);
    plant(&path, "negative-state", &[1; 16], &[0; 32], -1);
    for key in [
        "short-token",
        "short-fingerprint",
        "unknown-state",
        "negative-state",
    ] {
        let loaded = store.load(key).await.expect_err("load must refuse the row");
        assert_eq!(loaded.kind(), StoreErrorKind::Corrupt, "{key}: {loaded}");
        assert!(loaded.to_string().contains(key), "{loaded}");
        let claim = store
            .insert(key, &in_flight(Token::random(), HOUR, HOUR))
            .await;
        let claim = claim.expect_err("insert must refuse the row");
        assert_eq!(claim.kind(), StoreErrorKind::Corrupt, "{key}: {claim}");
        let token = Token::from_bytes([1; 16]);
        assert!(!store
            .swap(key, token, &completed(token, b"", HOUR))
            .await
            .unwrap());
    }
    let healthy = store
        .insert("healthy", &in_flight(Token::random(), HOUR, HOUR))
        .await;
    assert_eq!(
        healthy.unwrap(),
        Insert::Inserted,
        "other keys are unaffected"
    );
}
