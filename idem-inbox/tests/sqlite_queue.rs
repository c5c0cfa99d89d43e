//! The queue conformance kit against `SqliteQueue`, each case on a temp
//! file of its own; and what only SQLite shows.

mod support;

use std::time::Duration;

use idem_inbox::conformance::QueueFixture;
use idem_inbox::queue::{NewJob, Queue, SqliteQueue};

async fn factory() -> QueueFixture {
    let (queue, dir) = support::sqlite_queue().await;
    QueueFixture::new(queue, dir)
}

idem_inbox::queue_tests!(factory);

#[tokio::test]
async fn jobs_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    let queue = SqliteQueue::open(&path).await.unwrap();
    let id = queue
        .enqueue(NewJob::new("s", "e", b"kept".to_vec()))
        .await
        .unwrap();
    drop(queue);
    let reopened = SqliteQueue::open(&path).await.unwrap();
    reopened.migrate().await.unwrap();
    let jobs = reopened.claim(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(&jobs[0].id, id.id());
    assert_eq!(jobs[0].payload, b"kept");
}

#[tokio::test]
async fn a_completed_event_is_forgotten_only_after_its_retention() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue = queue.with_retention(Duration::from_millis(300));
    support::completed_event_is_forgotten_only_after_its_retention(&queue).await;
}

#[tokio::test]
async fn purge_deletes_only_completed_jobs_past_retention() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue = queue.with_retention(Duration::from_millis(100));
    support::purge_deletes_only_completed_jobs_past_retention(&queue).await;
}

/// The table as builds before lapses were counted made it.
const EARLIER_SCHEMA: &str = "
CREATE TABLE inbox_jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    state        TEXT    NOT NULL,
    attempts     INTEGER NOT NULL,
    run_after    INTEGER NOT NULL,
    lease_until  INTEGER,
    token        BLOB,
    last_error   TEXT,
    history      TEXT    NOT NULL,
    dedupe_until INTEGER NOT NULL,
    UNIQUE (source, event_id)
);
CREATE INDEX inbox_jobs_due ON inbox_jobs (state, run_after);
CREATE INDEX inbox_jobs_lease ON inbox_jobs (state, lease_until);
";

#[tokio::test]
async fn a_file_an_earlier_build_wrote_is_brought_up_to_date() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inbox.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(EARLIER_SCHEMA).unwrap();
        // A pending job, and one a killed worker of that build held on its
        // second attempt, its lease long lapsed.
        conn.execute_batch(
            "INSERT INTO inbox_jobs
                 (source, event_id, payload, state, attempts, run_after, lease_until,
                  token, history, dedupe_until)
             VALUES ('s', 'pending', x'01', 'pending', 0, 0, NULL, NULL, '[]', 9000000000000000),
                    ('s', 'held', x'02', 'running', 2, 0, 1, x'00', '[]', 9000000000000000)",
        )
        .unwrap();
    }
    let queue = SqliteQueue::open(&path).await.unwrap();
    let held = support::claim_what_an_earlier_build_left(&queue).await;
    // Opening it again changes nothing more.
    drop(queue);
    let reopened = SqliteQueue::open(&path).await.unwrap();
    let held = reopened.inspect(&held).await.unwrap().unwrap();
    assert_eq!((held.attempts, held.lapses), (2, 1));
}
