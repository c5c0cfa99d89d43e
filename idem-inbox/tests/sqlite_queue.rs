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
