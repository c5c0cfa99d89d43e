//! Grouped enqueues: the enqueues that arrive while a group is on its way
//! to the server go together in the next one — one statement, one commit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::PostgresQueue;
use crate::queue::{millis, Enqueued, JobId, NewJob, QueueError};

type Waiting = Vec<(NewJob, oneshot::Sender<Result<Enqueued, QueueError>>)>;

/// An event of a group: (source, event id).
type EventKey = (String, String);

/// The enqueues waiting for a group, and the turn to send one.
#[derive(Debug, Default)]
pub(super) struct Group {
    waiting: Mutex<Waiting>,
    /// Held while a group is on its way; whoever takes it next sends
    /// everything waiting by then.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Group {
    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        // Plain values: a panic while it was locked leaves the list whole.
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl PostgresQueue {
    /// Enqueues `job` in a group with whatever else is waiting, answering
    /// once the group is durable.
    pub(super) async fn enqueue_grouped(&self, job: NewJob) -> Result<Enqueued, QueueError> {
        let (answer, answered) = oneshot::channel();
        self.group.waiting().push((job, answer));
        let turn = Arc::clone(&self.group.turn).lock_owned().await;
        let group = std::mem::take(&mut *self.group.waiting());
        if !group.is_empty() {
            // Sent by a task of its own: a caller that goes away (a
            // receiver whose client hung up) must not cancel the others'
            // enqueues half-way.
            let queue = self.clone();
            tokio::spawn(async move {
                queue.send_group(group).await;
                drop(turn);
            });
        } else {
            drop(turn);
        }
        answered.await.map_err(backend_of)?
    }

    async fn send_group(&self, group: Waiting) {
        if group.len() == 1 {
            for (job, answer) in group {
                // A caller that is gone has no one to tell.
                let _ = answer.send(self.enqueue_alone(job).await);
            }
            return;
        }
        // One row per event (the first delivery of it in the group), in
        // (source, event id) order so that groups lock rows in one order.
        let mut firsts: Vec<usize> = Vec::new();
        let mut seen: HashMap<EventKey, usize> = HashMap::new();
        for (i, (job, _)) in group.iter().enumerate() {
            seen.entry((job.source.clone(), job.event_id.clone()))
                .or_insert_with(|| {
                    firsts.push(i);
                    i
                });
        }
        firsts.sort_by(|&a, &b| {
            let (a, b) = (&group[a].0, &group[b].0);
            (&a.source, &a.event_id).cmp(&(&b.source, &b.event_id))
        });
        let rows: Vec<&NewJob> = firsts.iter().map(|&i| &group[i].0).collect();
        match self.insert_group(&rows).await {
            Ok(mut held) => {
                for (i, (job, answer)) in group.into_iter().enumerate() {
                    let key = (job.source.clone(), job.event_id.clone());
                    let answered = match held.get(&key) {
                        // The first delivery of an event in the group learns
                        // what the group did with it; later ones are
                        // duplicates of it.
                        Some(enqueued) if seen.get(&key) == Some(&i) => Ok(enqueued.clone()),
                        Some(enqueued) => Ok(Enqueued::Duplicate(enqueued.id().clone())),
                        // Purged between the insert and the look-up: try it
                        // alone.
                        None => {
                            let alone = self.enqueue_alone(job).await;
                            if let Ok(enqueued) = &alone {
                                held.insert(key, enqueued.clone());
                            }
                            alone
                        }
                    };
                    let _ = answer.send(answered);
                }
            }
            // Each caller gets its own answer, or its own error.
            Err(_) => {
                for (job, answer) in group {
                    let _ = answer.send(self.enqueue_alone(job).await);
                }
            }
        }
    }

    /// Inserts `rows` (one per event) in one statement; returns what became
    /// of each event found afterwards.
    async fn insert_group(
        &self,
        rows: &[&NewJob],
    ) -> Result<HashMap<EventKey, Enqueued>, sqlx::Error> {
        let sources: Vec<&str> = rows.iter().map(|job| job.source.as_str()).collect();
        let events: Vec<&str> = rows.iter().map(|job| job.event_id.as_str()).collect();
        let payloads: Vec<&[u8]> = rows.iter().map(|job| job.payload.as_slice()).collect();
        let delays: Vec<f64> = rows.iter().map(|job| millis(job.delay) as f64).collect();
        let inserted: Vec<(i64, String, String)> = sqlx::query_as(&self.sql.enqueue_many)
            .bind(&sources)
            .bind(&events)
            .bind(&payloads)
            .bind(&delays)
            .bind(millis(self.retention) as f64)
            .fetch_all(&self.pool)
            .await?;
        let mut held: HashMap<EventKey, Enqueued> = inserted
            .into_iter()
            .map(|(id, source, event)| ((source, event), Enqueued::New(JobId::new(id.to_string()))))
            .collect();
        if held.len() < rows.len() {
            // The rest were held already; their rows are committed (the
            // insert waited for them) and only a purge removes rows.
            let (sources, events): (Vec<&str>, Vec<&str>) = rows
                .iter()
                .filter(|job| !held.contains_key(&(job.source.clone(), job.event_id.clone())))
                .map(|job| (job.source.as_str(), job.event_id.as_str()))
                .unzip();
            let found: Vec<(i64, String, String)> = sqlx::query_as(&self.sql.duplicates)
                .bind(&sources)
                .bind(&events)
                .fetch_all(&self.pool)
                .await?;
            for (id, source, event) in found {
                held.insert(
                    (source, event),
                    Enqueued::Duplicate(JobId::new(id.to_string())),
                );
            }
        }
        Ok(held)
    }
}

fn backend_of(e: oneshot::error::RecvError) -> QueueError {
    QueueError::Backend {
        backend: "postgres",
        source: Box::new(e),
    }
}
