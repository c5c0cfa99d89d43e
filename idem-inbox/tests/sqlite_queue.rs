//! The queue conformance kit against `SqliteQueue`, each case on a temp
//! file of its own; and what only SQLite shows.

mod support;

use std::time::Duration;

use idem_inbox::conformance::QueueFixture;
use idem_inbox::queue::{Enqueued, NewJob, Queue, SqliteQueue};

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
    let first = queue
        .enqueue(NewJob::new("s", "e", b"1".to_vec()))
        .await
        .unwrap();
    let job = queue
        .claim(1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    assert!(queue.complete(&job).await.unwrap().is_applied());
    assert_eq!(queue.purge_expired(100).await.unwrap(), 0);
    let early = queue
        .enqueue(NewJob::new("s", "e", b"2".to_vec()))
        .await
        .unwrap();
    assert!(matches!(early, Enqueued::Duplicate(_)));
    tokio::time::sleep(Duration::from_millis(350)).await;
    // Past retention the event may come again as a new job.
    let late = queue
        .enqueue(NewJob::new("s", "e", b"3".to_vec()))
        .await
        .unwrap();
    assert!(matches!(late, Enqueued::New(_)), "{late:?}");
    assert_eq!(late.id(), first.id());
    let again = queue.claim(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again[0].payload, b"3");
    assert_eq!(again[0].attempts, 1);
}

#[tokio::test]
async fn purge_deletes_only_completed_jobs_past_retention() {
    let (queue, _dir) = support::sqlite_queue().await;
    let queue = queue.with_retention(Duration::from_millis(100));
    for n in 0..5 {
        queue
            .enqueue(NewJob::new("s", n.to_string(), Vec::new()))
            .await
            .unwrap();
    }
    let jobs = queue.claim(3, Duration::from_secs(30)).await.unwrap();
    for job in &jobs {
        assert!(queue.complete(job).await.unwrap().is_applied());
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(queue.purge_expired(2).await.unwrap(), 2);
    assert_eq!(queue.purge_expired(100).await.unwrap(), 1);
    assert_eq!(
        queue
            .claim(10, Duration::from_secs(30))
            .await
            .unwrap()
            .len(),
        2
    );
}
