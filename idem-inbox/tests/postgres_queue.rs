//! The queue conformance kit against `PostgresQueue` on the real server at
//! `IDEM_POSTGRES_URL`, each case on a table of its own that is dropped when
//! the case ends; and what only PostgreSQL shows.

mod support;

use std::time::Duration;

use async_trait::async_trait;
use idem_inbox::conformance::{run_all, QueueFactory, QueueFixture};
use idem_inbox::queue::{Enqueued, NewJob, PostgresQueue, Queue, QueueError};
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
    let table = support::unique_name("inbox_old");
    let _guard = support::drop_table(&table);
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

/// 64 callers at once deliver 150 events three times each (so groups hold
/// several deliveries, some of one event): every event is enqueued once,
/// every answer names the job that holds its own event, and the table
/// holds one row per event.
async fn concurrent_deliveries_each_get_their_own_answer(groups: usize) {
    let Some(pool) = support::postgres_pool(8).await else {
        return;
    };
    let (queue, _guard) = support::postgres_queue(pool.clone()).await;
    let queue = std::sync::Arc::new(queue.with_enqueue_groups(groups));
    let (events, deliveries, callers) = (150usize, 3usize, 64usize);
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let queue = std::sync::Arc::clone(&queue);
        tasks.spawn(async move {
            let mut answers = Vec::new();
            for n in (caller..events * deliveries).step_by(callers) {
                let event = format!("evt_{}", n % events);
                let answer = queue
                    .enqueue(NewJob::new("s", &event, event.as_bytes().to_vec()))
                    .await
                    .unwrap();
                answers.push((event, answer));
            }
            answers
        });
    }
    let mut by_event: std::collections::HashMap<String, Vec<Enqueued>> = Default::default();
    while let Some(answers) = tasks.join_next().await {
        for (event, answer) in answers.unwrap() {
            by_event.entry(event).or_default().push(answer);
        }
    }
    assert_eq!(by_event.len(), events);
    for (event, answers) in &by_event {
        assert_eq!(answers.len(), deliveries, "{event}");
        let new = answers
            .iter()
            .filter(|a| matches!(a, Enqueued::New(_)))
            .count();
        assert_eq!(new, 1, "{event} was enqueued {new} times: {answers:?}");
        let id = answers[0].id();
        assert!(answers.iter().all(|a| a.id() == id), "{event}: {answers:?}");
        let held = queue.inspect(id).await.unwrap().unwrap();
        assert_eq!(
            held.event_id, *event,
            "the answer for {event} names another job"
        );
        assert_eq!(held.payload, event.as_bytes());
    }
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", queue.table()))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, events as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_enqueues_give_each_delivery_its_own_answer() {
    concurrent_deliveries_each_get_their_own_answer(idem_inbox::queue::DEFAULT_ENQUEUE_GROUPS)
        .await;
    concurrent_deliveries_each_get_their_own_answer(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_sent_alone_give_each_delivery_its_own_answer() {
    concurrent_deliveries_each_get_their_own_answer(0).await;
}

/// A row the server refuses (text with a NUL byte) in a burst of good
/// ones: its own enqueue fails, every other one lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_server_refuses_fails_only_its_own_enqueue() {
    let Some(pool) = support::postgres_pool(4).await else {
        return;
    };
    let (queue, _guard) = support::postgres_queue(pool).await;
    let queue = std::sync::Arc::new(queue.with_enqueue_groups(1));
    for round in 0..5 {
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..32 {
            let queue = std::sync::Arc::clone(&queue);
            let event = if n == 7 {
                format!("bad\0{round}")
            } else {
                format!("good_{round}_{n}")
            };
            tasks.spawn(async move {
                let answer = queue.enqueue(NewJob::new("s", &event, Vec::new())).await;
                (event, answer)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let (event, answer) = joined.unwrap();
            match (event.starts_with("bad"), answer) {
                (true, Err(QueueError::Backend { .. })) => {}
                (false, Ok(Enqueued::New(id))) => {
                    assert_eq!(queue.inspect(&id).await.unwrap().unwrap().event_id, event);
                }
                (_, answer) => panic!("{event:?} answered {answer:?}"),
            }
        }
    }
    assert_eq!(queue.depth().await.unwrap(), Some(5 * 31));
}
