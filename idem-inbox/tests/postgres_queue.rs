//! The queue conformance kit against `PostgresQueue` on the real server at
//! `IDEM_POSTGRES_URL`, each case on a table of its own that is dropped when
//! the case ends; and what only PostgreSQL shows.

mod support;

use std::time::Duration;

use async_trait::async_trait;
use idem_inbox::conformance::{run_all, QueueFactory, QueueFixture};
use idem_inbox::queue::{NewJob, PostgresQueue, Queue, QueueError};
use sqlx::PgPool;

struct Tables(PgPool);

#[async_trait]
impl QueueFactory for Tables {
    async fn fixture(&self) -> QueueFixture {
        let (queue, guard) = support::postgres_queue(self.0.clone()).await;
        QueueFixture::new(queue, guard)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_passes_the_conformance_kit() {
    let Some(pool) = support::postgres_pool(16).await else {
        return;
    };
    run_all(Tables(pool)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_event_is_forgotten_only_after_its_retention() {
    let Some(pool) = support::postgres_pool(4).await else {
        return;
    };
    let (queue, _guard) = support::postgres_queue(pool).await;
    let queue = queue.with_retention(Duration::from_millis(300));
    support::completed_event_is_forgotten_only_after_its_retention(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_only_completed_jobs_past_retention() {
    let Some(pool) = support::postgres_pool(4).await else {
        return;
    };
    let (queue, _guard) = support::postgres_queue(pool).await;
    let queue = queue.with_retention(Duration::from_millis(100));
    support::purge_deletes_only_completed_jobs_past_retention(&queue).await;
}

#[tokio::test]
async fn table_names_that_could_inject_sql_are_refused() {
    let pool = PgPool::connect_lazy(&support::postgres_url()).unwrap();
    for bad in [
        "",
        "jobs; DROP TABLE x",
        "1jobs",
        "jobs-1",
        "j\u{e9}",
        &"x".repeat(49),
    ] {
        assert!(
            matches!(
                PostgresQueue::from_pool(pool.clone()).with_table(bad),
                Err(QueueError::InvalidName(_))
            ),
            "{bad:?} was accepted"
        );
    }
    assert!(PostgresQueue::from_pool(pool)
        .with_table("inbox_jobs_2")
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent() {
    let Some(pool) = support::postgres_pool(2).await else {
        return;
    };
    let (queue, _guard) = support::postgres_queue(pool).await;
    queue.migrate().await.unwrap();
    queue
        .enqueue(NewJob::new("s", "e", Vec::new()))
        .await
        .unwrap();
    queue.migrate().await.unwrap();
    assert_eq!(
        queue.claim(5, Duration::from_secs(5)).await.unwrap().len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_an_earlier_build_made_is_brought_up_to_date() {
    let Some(pool) = support::postgres_pool(2).await else {
        return;
    };
    let table = support::unique_table("inbox_old");
    let _guard = support::DropTable(table.clone());
    // The table as builds before lapses were counted made it, with a
    // pending job and one a killed worker held on its second attempt.
    sqlx::query(&format!(
        "CREATE TABLE {table} (
             id           BIGSERIAL PRIMARY KEY,
             source       TEXT        NOT NULL,
             event_id     TEXT        NOT NULL,
             payload      BYTEA       NOT NULL,
             state        TEXT        NOT NULL,
             attempts     INTEGER     NOT NULL,
             run_after    TIMESTAMPTZ NOT NULL,
             lease_until  TIMESTAMPTZ,
             token        BYTEA,
             last_error   TEXT,
             history      JSONB       NOT NULL,
             dedupe_until TIMESTAMPTZ NOT NULL,
             UNIQUE (source, event_id))"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table}
             (source, event_id, payload, state, attempts, run_after, lease_until, token,
              history, dedupe_until)
         VALUES ('s', 'pending', '\\x01', 'pending', 0, now(), NULL, NULL, '[]',
                 now() + interval '1 day'),
                ('s', 'held', '\\x02', 'running', 2, now(), now() - interval '1 minute',
                 '\\x00', '[]', now() + interval '1 day')"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let queue = PostgresQueue::from_pool(pool).with_table(&table).unwrap();
    queue.migrate().await.unwrap();
    queue.migrate().await.unwrap();
    let held = support::claim_what_an_earlier_build_left(&queue).await;
    let held = queue.inspect(&held).await.unwrap().unwrap();
    assert_eq!((held.attempts, held.lapses), (2, 1));
}
