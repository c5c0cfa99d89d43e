//! Another process holding the database: a bounded wait, a clear error,
//! and a store that works again once the lock is gone.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use idem_core::store::{Insert, Store, StoreErrorKind, Token};
use idem_sqlite::rusqlite::Connection;
use idem_sqlite::{SqliteStore, DEFAULT_BUSY_TIMEOUT};

use crate::support::{child_db, fresh, in_flight, ChildProcess};

const HOUR: Duration = Duration::from_secs(3600);
const BUSY: Duration = Duration::from_millis(300);

/// The child's part: take the lock the way `setup` says, report it, and
/// hold it until the parent closes our stdin (or dies).
fn hold_lock(db: &std::path::Path, setup: &str) {
    let conn = Connection::open(db).expect("the child opens the file");
    // The parent's store may still be closing its connection.
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch(setup).expect("the child takes the lock");
    let mut out = std::io::stdout().lock();
    writeln!(out, "locked").unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

#[tokio::test]
async fn another_process_holding_the_write_lock_gives_a_clear_error_then_writes_resume() {
    const ROLE: &str = "hold-write-lock";
    const TEST: &str =
        "locking::another_process_holding_the_write_lock_gives_a_clear_error_then_writes_resume";
    if let Some(db) = child_db(ROLE) {
        // In WAL mode an exclusive transaction keeps writers out, not readers.
        return hold_lock(&db, "BEGIN EXCLUSIVE;");
    }
    let (store, _dir, path) = fresh().await;
    let store = store.with_busy_timeout(BUSY);
    let kept = Token::random();
    store
        .insert("kept", &in_flight(kept, HOUR, HOUR))
        .await
        .unwrap();

    let child = ChildProcess::spawn(TEST, ROLE, &path);
    child.expect_line("locked", Duration::from_secs(30));

    let started = Instant::now();
    let error = store
        .insert("new", &in_flight(Token::random(), HOUR, HOUR))
        .await
        .expect_err("the write lock is held by the child");
    let waited = started.elapsed();
    assert_eq!(error.kind(), StoreErrorKind::Backend);
    assert!(
        error.to_string().contains("locked by another connection"),
        "{error}"
    );
    assert!(waited >= BUSY / 2, "it waited for the lock ({waited:?})");
    assert!(waited < BUSY * 10, "the wait is bounded ({waited:?})");
    let loaded = store.load("kept").await.expect("reads go on meanwhile");
    assert_eq!(loaded.expect("kept").token, kept);

    release(child);
    let inserted = store
        .insert("new", &in_flight(Token::random(), HOUR, HOUR))
        .await;
    assert_eq!(inserted.unwrap(), Insert::Inserted, "the store works again");
}

#[tokio::test]
async fn a_file_held_exclusively_by_another_process_fails_to_open_then_opens_once_free() {
    const ROLE: &str = "hold-exclusive-lock";
    const TEST: &str =
        "locking::a_file_held_exclusively_by_another_process_fails_to_open_then_opens_once_free";
    if let Some(db) = child_db(ROLE) {
        // Exclusive locking mode keeps even readers out until it closes.
        return hold_lock(
            &db,
            "PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; COMMIT;",
        );
    }
    // An open store keeps a shared lock on its WAL-mode file, so an
    // exclusive hold can only come before the store opens.
    let (store, _dir, path) = fresh().await;
    drop(store);
    let child = ChildProcess::spawn(TEST, ROLE, &path);
    child.expect_line("locked", Duration::from_secs(30));

    let started = Instant::now();
    let error = SqliteStore::open(&path)
        .await
        .expect_err("the child holds the file exclusively");
    let waited = started.elapsed();
    assert_eq!(error.kind(), StoreErrorKind::Backend);
    assert!(
        error.to_string().contains("locked by another connection"),
        "{error}"
    );
    assert!(waited >= DEFAULT_BUSY_TIMEOUT / 2, "it waited ({waited:?})");
    assert!(
        waited < DEFAULT_BUSY_TIMEOUT * 4,
        "the wait is bounded ({waited:?})"
    );

    release(child);
    let store = SqliteStore::open(&path)
        .await
        .expect("the file opens once free");
    let inserted = store
        .insert("k", &in_flight(Token::random(), HOUR, HOUR))
        .await;
    assert_eq!(inserted.unwrap(), Insert::Inserted);
}

/// Closes the child's stdin, which ends it and frees its lock.
fn release(mut child: ChildProcess) {
    drop(child.child.stdin.take());
    let status = child.child.wait().unwrap();
    assert!(status.success(), "the child exits cleanly: {status}");
}
