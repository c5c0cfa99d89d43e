//! Settling a held job: complete, retry, release.

use std::time::Duration;

use tokio::time::Instant;

use super::super::support::{claim, claim_one, enqueue_new, past, settled, source, LEASE, LONG};
use super::super::QueueFactory;
use crate::queue::{Job, JobId, JobState, NewJob, Settle, Token};

/// A completed job is not claimed again, even after its lease would lapse.
pub async fn completed_job_is_never_claimed_again(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let id = enqueue_new(&*queue, NewJob::new(source("done"), "e", Vec::new())).await;
    let job = claim_one(&*queue, LEASE).await;
    assert_eq!(
        settled(queue.complete(&job).await, "complete"),
        Settle::Applied
    );
    past(LEASE).await;
    assert!(
        claim(&*queue, 10, LONG).await.is_empty(),
        "a completed job was claimed"
    );
    assert_eq!(
        settled(queue.complete(&job).await, "complete"),
        Settle::LeaseLost
    );
    let info = queue.inspect(&id).await.unwrap().expect("the job is kept");
    assert_eq!(info.state, JobState::Done);
}

/// A retried job is due again, carrying its error and one more attempt.
pub async fn retried_job_is_due_again_with_its_error(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let id = enqueue_new(&*queue, NewJob::new(source("retry"), "e", Vec::new())).await;
    let job = claim_one(&*queue, LONG).await;
    let retried = queue.retry(&job, Duration::ZERO, "upstream 503").await;
    assert_eq!(settled(retried, "retry"), Settle::Applied);
    let again = claim_one(&*queue, LONG).await;
    assert_eq!(again.id, id);
    assert_eq!(again.attempts, 2);
    assert_eq!(again.last_error.as_deref(), Some("upstream 503"));
    let info = queue.inspect(&id).await.unwrap().unwrap();
    assert_eq!(info.history.len(), 1);
    assert_eq!(info.history[0].attempt, 1);
    assert_eq!(info.history[0].error, "upstream 503");
}

/// A retry's delay holds the job back until it has passed.
pub async fn retry_delay_is_honoured(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    enqueue_new(&*queue, NewJob::new(source("delay"), "e", Vec::new())).await;
    let job = claim_one(&*queue, LONG).await;
    let delay = Duration::from_millis(400);
    let began = Instant::now();
    assert!(queue
        .retry(&job, delay, "later")
        .await
        .unwrap()
        .is_applied());
    let early = claim(&*queue, 1, LONG).await;
    if began.elapsed() < delay {
        assert!(
            early.is_empty(),
            "a retried job was claimed before its delay"
        );
    }
    claim_one(&*queue, LONG).await;
    assert!(began.elapsed() >= delay - Duration::from_millis(20));
}

/// A released job is due at once and the attempt is not counted.
pub async fn released_job_is_due_at_once_without_an_attempt(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    enqueue_new(&*queue, NewJob::new(source("release"), "e", Vec::new())).await;
    let job = claim_one(&*queue, LONG).await;
    assert_eq!(
        settled(queue.release(&job).await, "release"),
        Settle::Applied
    );
    let again = claim(&*queue, 1, LONG).await;
    assert_eq!(again.len(), 1, "a released job was not due at once");
    assert_eq!(again[0].attempts, 1, "a release counted an attempt");
    assert_eq!(again[0].last_error, None);
}

/// Settling a job the queue never issued changes nothing.
pub async fn settling_an_unknown_job_is_lease_lost(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    enqueue_new(&*queue, NewJob::new(source("unknown"), "e", Vec::new())).await;
    let real = claim_one(&*queue, LONG).await;
    let forged = Job {
        token: Token::from_bytes(vec![0; 16]),
        ..real.clone()
    };
    let missing = Job {
        id: JobId::new("not-a-job"),
        ..real.clone()
    };
    for job in [&forged, &missing] {
        assert_eq!(
            settled(queue.complete(job).await, "complete"),
            Settle::LeaseLost
        );
        assert_eq!(
            settled(queue.heartbeat(job, LONG).await, "heartbeat"),
            Settle::LeaseLost
        );
        assert_eq!(
            settled(queue.retry(job, Duration::ZERO, "x").await, "retry"),
            Settle::LeaseLost
        );
        assert_eq!(
            settled(queue.release(job).await, "release"),
            Settle::LeaseLost
        );
        assert_eq!(
            settled(queue.dead_letter(job, "x").await, "dead_letter"),
            Settle::LeaseLost
        );
    }
    assert!(queue
        .inspect(&JobId::new("not-a-job"))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        settled(queue.complete(&real).await, "complete"),
        Settle::Applied
    );
}

/// A group completion settles each job by its own token: held jobs are
/// done, a forged, unknown or stale token changes nothing, and each job
/// learns its own settlement, in order.
pub async fn group_completion_fences_each_job_by_its_token(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    assert_eq!(group(queue.complete_many(&[]).await), Vec::<Settle>::new());
    let source = source("group");
    for event in ["a", "b", "c"] {
        enqueue_new(&*queue, NewJob::new(&source, event, Vec::new())).await;
    }
    let mut held = claim(&*queue, 10, LONG).await;
    assert_eq!(held.len(), 3);
    held.sort_by(|x, y| x.event_id.cmp(&y.event_id));
    let forged = Job {
        token: Token::from_bytes(vec![0; 16]),
        ..held[1].clone()
    };
    let missing = Job {
        id: JobId::new("not-a-job"),
        ..held[0].clone()
    };
    let mixed = [held[0].clone(), forged, held[2].clone(), missing];
    assert_eq!(
        group(queue.complete_many(&mixed).await),
        vec![
            Settle::Applied,
            Settle::LeaseLost,
            Settle::Applied,
            Settle::LeaseLost
        ]
    );
    for (job, state) in [
        (&held[0], JobState::Done),
        (&held[1], JobState::Running),
        (&held[2], JobState::Done),
    ] {
        let info = queue.inspect(&job.id).await.unwrap().expect("the job");
        assert_eq!(info.state, state, "event {}", job.event_id);
    }
    assert_eq!(
        group(
            queue
                .complete_many(&[held[0].clone(), held[2].clone()])
                .await
        ),
        vec![Settle::LeaseLost, Settle::LeaseLost],
        "a completed job was completed again"
    );
    // A late holder's token in the same group as the new holder's.
    enqueue_new(&*queue, NewJob::new(&source, "d", Vec::new())).await;
    let late = claim_one(&*queue, LEASE).await;
    past(LEASE).await;
    let now = claim_one(&*queue, LONG).await;
    assert_eq!(now.id, late.id);
    assert_eq!(
        group(queue.complete_many(&[late.clone(), now.clone()]).await),
        vec![Settle::LeaseLost, Settle::Applied]
    );
    assert!(
        claim(&*queue, 10, LONG).await.is_empty(),
        "a job completed in a group was claimed again"
    );
    assert_eq!(
        settled(queue.complete(&held[1]).await, "complete"),
        Settle::Applied
    );
}

/// Unwraps a group completion, failing the case on a backend error.
fn group(result: Result<Vec<Settle>, crate::queue::QueueError>) -> Vec<Settle> {
    result.unwrap_or_else(|e| panic!("complete_many failed: {e}"))
}
