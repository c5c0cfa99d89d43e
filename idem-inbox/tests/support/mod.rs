//! What the test binaries share: PostgreSQL queues and stores on tables of
//! their own (the server, the skip-or-fail policy, unique names and the
//! guards that drop the tables come from `idem-testing`), SQLite queues in
//! temp files, and cases both queues run.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use idem_inbox::queue::{Enqueued, NewJob, PostgresQueue, Queue, SqliteQueue};
use idem_testing::{Cleanup, Server};
use sqlx::postgres::PgPool;

pub use idem_testing::unique_name;

/// The server under test: `IDEM_POSTGRES_URL`, or the local one.
pub fn postgres_url() -> String {
    Server::Postgres.url()
}

/// A pool on the server under test, or `None` (with the reason printed)
/// when it cannot be reached. Under `CI` an unreachable server fails.
pub async fn postgres_pool(size: u32) -> Option<PgPool> {
    idem_testing::sql_pool(Server::Postgres, &postgres_url(), size).await
}

/// Drops `table`, and the dedupe keys a queue keeps beside it, on the
/// server under test when dropped.
pub fn drop_table(table: &str) -> Cleanup {
    Cleanup::postgres(
        &postgres_url(),
        format!("DROP TABLE IF EXISTS {table}, {table}_keys"),
    )
}

/// A migrated queue on a fresh table of `pool`, and the guard dropping it.
pub async fn postgres_queue(pool: PgPool) -> (PostgresQueue, Cleanup) {
    let table = unique_name("inbox_q");
    let queue = PostgresQueue::from_pool(pool)
        .with_table(&table)
        .expect("a valid table name");
    let guard = drop_table(&table);
    queue.migrate().await.expect("migrate");
    (queue, guard)
}

/// A queue in a temp file, and the directory that removes it.
pub async fn sqlite_queue() -> (SqliteQueue, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let queue = SqliteQueue::open(dir.path().join("inbox.db"))
        .await
        .expect("open the queue");
    (queue, dir)
}

/// A completed event stays a duplicate until its retention (300 ms here)
/// passes, then may come again as a new job in the same row. `queue` must
/// have been built with a 300 ms retention.
pub async fn completed_event_is_forgotten_only_after_its_retention(queue: &dyn Queue) {
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

/// Purge deletes completed jobs past retention (100 ms here), up to its
/// limit, and nothing else.
pub async fn purge_deletes_only_completed_jobs_past_retention(queue: &dyn Queue) {
    for n in 0..5 {
        queue
            .enqueue(NewJob::new("s", n.to_string(), Vec::new()))
            .await
            .unwrap();
    }
    for job in queue.claim(3, Duration::from_secs(30)).await.unwrap() {
        assert!(queue.complete(&job).await.unwrap().is_applied());
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

/// Claims the two jobs an earlier build left in `queue` — event `pending`
/// (payload 1) never claimed, and event `held` (payload 2) that a killed
/// worker held on its second attempt, its lease lapsed — checks that they
/// count as this build counts, completes them, and returns the held job.
pub async fn claim_what_an_earlier_build_left(queue: &dyn Queue) -> idem_inbox::queue::JobId {
    let mut jobs = queue.claim(10, Duration::from_secs(30)).await.unwrap();
    jobs.sort_by(|a, b| a.event_id.cmp(&b.event_id));
    let counts: Vec<_> = jobs
        .iter()
        .map(|j| (j.event_id.as_str(), j.payload.clone(), j.attempts, j.lapses))
        .collect();
    assert_eq!(
        counts,
        [("held", vec![2], 2, 1), ("pending", vec![1], 1, 0)]
    );
    for job in &jobs {
        assert!(queue.complete(job).await.unwrap().is_applied());
    }
    jobs[0].id.clone()
}

/// A migrated idem store on a fresh table of `pool`, and the guard
/// dropping it.
pub async fn postgres_store(pool: PgPool) -> (idem_postgres::PostgresStore, Cleanup) {
    let table = unique_name("inbox_idem");
    let store = idem_postgres::PostgresStore::from_pool(pool)
        .with_table(&table)
        .expect("a valid table name");
    let guard = drop_table(&table);
    store.migrate().await.expect("migrate");
    (store, guard)
}
