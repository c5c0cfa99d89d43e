//! Grouped enqueues: the enqueues that arrive while the queue's statements
//! are on their way go together, as one `INSERT … SELECT FROM unnest(…)`.
//!
//! A receiver under load sends many single-row inserts at once, and each
//! costs PostgreSQL a statement, a transaction and a commit, and the client
//! a round trip; grouped, a burst of deliveries costs a few statements. At
//! most `in_flight` group statements run at once; an enqueue that finds one
//! free goes at once (alone, if nothing else is waiting), so a quiet
//! receiver answers as fast as before. An enqueue that finds none waits,
//! and the first to get one takes every enqueue waiting by then.
//!
//! Each group runs in a task of its own, so a caller that goes away (a
//! provider closing its connection) cannot cut short the group that holds
//! other callers' jobs. A group that fails is sent again one job at a time,
//! so each caller gets its own answer and one bad row fails only its own
//! enqueue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use sqlx::PgPool;
use tokio::sync::{oneshot, Semaphore};

use super::{backend, enqueue_one, Sql};
use crate::queue::{millis, Enqueued, JobId, NewJob, QueueError};

/// The most jobs one group statement carries.
const MAX_JOBS: usize = 256;

/// The most payload bytes one group statement carries (a job larger than
/// this goes alone).
const MAX_BYTES: usize = 4 << 20;

type Answer = oneshot::Sender<Result<Enqueued, QueueError>>;

/// The enqueues waiting for a statement, and the statements free to carry
/// them.
#[derive(Debug)]
pub(super) struct Groups {
    waiting: Mutex<Vec<(NewJob, Answer)>>,
    slots: Arc<Semaphore>,
}

impl Groups {
    pub(super) fn new(in_flight: usize) -> Groups {
        Groups {
            waiting: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(in_flight.max(1))),
        }
    }

    fn waiting(&self) -> MutexGuard<'_, Vec<(NewJob, Answer)>> {
        // The list holds plain values: a panic while it was locked leaves
        // it whole.
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the waiting jobs that fit in one statement, oldest first.
    fn take(&self) -> Vec<(NewJob, Answer)> {
        let mut waiting = self.waiting();
        let (mut count, mut bytes) = (0, 0);
        for (job, _) in waiting.iter() {
            if count > 0 && (count == MAX_JOBS || bytes + job.payload.len() > MAX_BYTES) {
                break;
            }
            count += 1;
            bytes += job.payload.len();
        }
        waiting.drain(..count).collect()
    }

    /// Enqueues `job` in a group with whatever else is waiting.
    pub(super) async fn enqueue(
        &self,
        pool: &PgPool,
        sql: &Arc<Sql>,
        retention_ms: i64,
        job: NewJob,
    ) -> Result<Enqueued, QueueError> {
        let (answer, mut answered) = oneshot::channel();
        self.waiting().push((job, answer));
        tokio::select! {
            biased;
            answer = &mut answered => return answer.unwrap_or_else(|_| Err(gone())),
            slot = Arc::clone(&self.slots).acquire_owned() => {
                // The semaphore is never closed.
                let slot = slot.map_err(|_| gone())?;
                let group = self.take();
                if group.is_empty() {
                    // Another caller's group took this job.
                    drop(slot);
                } else {
                    let (pool, sql) = (pool.clone(), Arc::clone(sql));
                    tokio::spawn(async move {
                        send(&pool, &sql, retention_ms, group).await;
                        drop(slot);
                    });
                }
            }
        }
        answered.await.unwrap_or_else(|_| Err(gone()))
    }
}

/// The answer of a job whose group task ended without answering: the
/// runtime is shutting down.
fn gone() -> QueueError {
    QueueError::Backend {
        backend: super::BACKEND,
        source: "the task enqueueing the job stopped before it answered (runtime shutting down)"
            .into(),
    }
}

/// Sends one group and answers each of its callers.
async fn send(pool: &PgPool, sql: &Sql, retention_ms: i64, group: Vec<(NewJob, Answer)>) {
    if group.len() == 1 {
        for (job, answer) in group {
            // A caller that is gone has no one to tell.
            let _ = answer.send(enqueue_one(pool, sql, retention_ms, job).await);
        }
        return;
    }
    let (jobs, answers): (Vec<NewJob>, Vec<Answer>) = group.into_iter().unzip();
    match grouped(pool, sql, retention_ms, &jobs).await {
        Ok(results) => {
            for (answer, result) in answers.into_iter().zip(results) {
                let _ = answer.send(result);
            }
        }
        Err(_) => {
            // Sent again one by one: a row the server refuses (text it
            // cannot store, say) fails only its own caller. A job whose
            // row did land before the failure cannot have: the statement
            // is one transaction.
            for (job, answer) in jobs.into_iter().zip(answers) {
                let _ = answer.send(enqueue_one(pool, sql, retention_ms, job).await);
            }
        }
    }
}

/// Enqueues `jobs` in one statement; returns one result per job, in order.
async fn grouped(
    pool: &PgPool,
    sql: &Sql,
    retention_ms: i64,
    jobs: &[NewJob],
) -> Result<Vec<Result<Enqueued, QueueError>>, QueueError> {
    // One row per event: a second delivery of an event in the same group is
    // a duplicate of the first, as it would be one statement later (and
    // `ON CONFLICT DO UPDATE` may not touch a row twice in one statement).
    let mut first: HashMap<(&str, &str), usize> = HashMap::new();
    let mut distinct = Vec::new();
    for (n, job) in jobs.iter().enumerate() {
        first
            .entry((job.source.as_str(), job.event_id.as_str()))
            .or_insert_with(|| {
                distinct.push(n);
                n
            });
    }
    let column = |f: fn(&NewJob) -> &str| distinct.iter().map(|&n| f(&jobs[n])).collect::<Vec<_>>();
    let (sources, events) = (column(|j| &j.source), column(|j| &j.event_id));
    let payloads: Vec<&[u8]> = distinct.iter().map(|&n| &jobs[n].payload[..]).collect();
    let delays: Vec<f64> = distinct
        .iter()
        .map(|&n| millis(jobs[n].delay) as f64)
        .collect();
    let inserted: Vec<(i64, String, String)> = sqlx::query_as(&sql.enqueue_group)
        .bind(&sources)
        .bind(&events)
        .bind(&payloads)
        .bind(&delays)
        .bind(retention_ms as f64)
        .fetch_all(pool)
        .await
        .map_err(backend)?;
    let mut found: HashMap<(String, String), Enqueued> = inserted
        .into_iter()
        .map(|(id, source, event)| ((source, event), Enqueued::New(JobId::new(id.to_string()))))
        .collect();
    // The events the queue already held: their rows are committed (the
    // insert waited for them), so one read finds them, unless a purge of a
    // completed, expired job ran in between.
    let held: Vec<usize> = distinct
        .iter()
        .copied()
        .filter(|&n| !found.contains_key(&(jobs[n].source.clone(), jobs[n].event_id.clone())))
        .collect();
    if !held.is_empty() {
        let sources: Vec<&str> = held.iter().map(|&n| jobs[n].source.as_str()).collect();
        let events: Vec<&str> = held.iter().map(|&n| jobs[n].event_id.as_str()).collect();
        let rows: Vec<(i64, String, String)> = sqlx::query_as(&sql.duplicates)
            .bind(&sources)
            .bind(&events)
            .fetch_all(pool)
            .await
            .map_err(backend)?;
        for (id, source, event) in rows {
            found.insert(
                (source, event),
                Enqueued::Duplicate(JobId::new(id.to_string())),
            );
        }
    }
    let mut results = Vec::with_capacity(jobs.len());
    for (n, job) in jobs.iter().enumerate() {
        let key = (job.source.clone(), job.event_id.clone());
        let result = match found.get(&key) {
            // The group's own first delivery of the event made or found it.
            Some(done) if first[&(job.source.as_str(), job.event_id.as_str())] == n => {
                Ok(done.clone())
            }
            Some(done) => Ok(Enqueued::Duplicate(done.id().clone())),
            // Purged between the insert and the read: enqueue it again.
            None => {
                let again = enqueue_one(pool, sql, retention_ms, job.clone()).await;
                if let Ok(done) = &again {
                    found.insert(key, done.clone());
                }
                again
            }
        };
        results.push(result);
    }
    Ok(results)
}
