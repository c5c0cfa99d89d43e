//! Group completion: the completions of jobs that finish while another
//! completion is on its way to the queue are sent together, in one
//! [`Queue::complete_many`] call, once it is back.
//!
//! A queue round trip (and, for a durable queue, a commit) per completion
//! is what a worker pays on top of a bare claim-and-mark-done loop; under
//! load the jobs of a worker finish close together, so grouping makes the
//! completion cost a fraction of a round trip each. Nothing waits for a
//! group to fill: a completion arriving at an idle completer goes at once,
//! alone. Each job is still fenced by its own token and learns its own
//! [`Settle`].

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::queue::{Job, Queue, QueueError, Settle};

type Waiting = Vec<(Job, oneshot::Sender<Result<Settle, QueueError>>)>;

pub(crate) struct Completer {
    queue: Arc<dyn Queue>,
    /// Completions not yet sent.
    waiting: Mutex<Waiting>,
    /// Held while a group is on its way; whoever takes it next sends
    /// everything waiting by then.
    turn: tokio::sync::Mutex<()>,
}

impl Completer {
    pub(crate) fn new(queue: Arc<dyn Queue>) -> Completer {
        Completer {
            queue,
            waiting: Mutex::new(Vec::new()),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Marks `job` done, in a group with whatever else is waiting.
    pub(crate) async fn complete(&self, job: &Job) -> Result<Settle, QueueError> {
        let (answer, mut answered) = oneshot::channel();
        self.waiting().push((job.clone(), answer));
        // Wait for the turn only while the job is unanswered: a job that
        // went in someone else's group must not queue behind later groups
        // to learn how it settled.
        let answer = tokio::select! {
            biased;
            answer = &mut answered => answer,
            _turn = self.turn.lock() => {
                let group = std::mem::take(&mut *self.waiting());
                if !group.is_empty() {
                    self.send(group).await;
                }
                answered.await
            }
        };
        match answer {
            Ok(settled) => settled,
            // The task sending this job's group was cancelled mid-way: the
            // completion may or may not have landed, and a fenced
            // completion is safe to repeat (a landed one now answers
            // `LeaseLost`).
            Err(_) => self.queue.complete(job).await,
        }
    }

    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        // The list holds plain values: a panic while it was locked leaves
        // it whole.
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn send(&self, group: Waiting) {
        let (jobs, answers): (Vec<Job>, Vec<_>) = group.into_iter().unzip();
        let grouped = match jobs.len() {
            1 => None,
            n => match self.queue.complete_many(&jobs).await {
                Ok(settled) if settled.len() == n => Some(settled),
                _ => None,
            },
        };
        match grouped {
            Some(settled) => {
                for (answer, settled) in answers.into_iter().zip(settled) {
                    // A caller that is gone has no one to tell.
                    let _ = answer.send(Ok(settled));
                }
            }
            // A lone job, or a failed group sent again one job at a time so
            // that each caller gets its own answer (a completion that did
            // land before the failure answers `LeaseLost`, and the job is
            // done).
            None => {
                for (job, answer) in jobs.iter().zip(answers) {
                    let _ = answer.send(self.queue.complete(job).await);
                }
            }
        }
    }
}
