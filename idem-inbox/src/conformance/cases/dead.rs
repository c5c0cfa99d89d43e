//! Dead letters: parked with their history, listed, requeued.

use std::time::Duration;

use super::super::support::{claim, claim_one, enqueue_new, past, settled, source, LEASE, LONG};
use super::super::QueueFactory;
use crate::queue::{JobId, JobState, NewJob, Settle};

/// A dead letter is not claimed, is listed, and keeps every failed attempt.
pub async fn dead_letter_keeps_the_job_and_its_history(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("dead");
    let id = enqueue_new(&*queue, NewJob::new(&src, "e", b"body".to_vec())).await;
    for n in 1..=2 {
        let job = claim_one(&*queue, LONG).await;
        let retried = queue
            .retry(&job, Duration::ZERO, &format!("failure {n}"))
            .await;
        assert_eq!(settled(retried, "retry"), Settle::Applied);
    }
    let job = claim_one(&*queue, LONG).await;
    assert_eq!(job.attempts, 3);
    assert_eq!(
        settled(queue.dead_letter(&job, "gave up").await, "dead_letter"),
        Settle::Applied
    );
    assert!(
        claim(&*queue, 10, LONG).await.is_empty(),
        "a dead letter was claimed"
    );
    let listed = queue.dead_letters(100).await.unwrap();
    let info = listed
        .iter()
        .find(|i| i.id == id)
        .expect("the dead letter is listed");
    assert_eq!(info.state, JobState::Dead);
    assert_eq!(info.source, src);
    assert_eq!(info.payload, b"body");
    assert_eq!(info.attempts, 3);
    assert_eq!(info.last_error.as_deref(), Some("gave up"));
    let history: Vec<_> = info
        .history
        .iter()
        .map(|a| (a.attempt, a.error.as_str()))
        .collect();
    assert_eq!(
        history,
        [(1, "failure 1"), (2, "failure 2"), (3, "gave up")]
    );
    assert!(info.history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    assert_eq!(queue.inspect(&id).await.unwrap().as_ref(), Some(info));
    // Still a duplicate: a resent event does not slip past a dead letter.
    let again = queue
        .enqueue(NewJob::new(&src, "e", Vec::new()))
        .await
        .unwrap();
    assert_eq!(again.id(), &id);
    assert!(matches!(again, crate::queue::Enqueued::Duplicate(_)));
}

/// A requeued dead letter is due at once, attempts and lapses counted
/// afresh, history kept.
pub async fn requeue_makes_a_dead_letter_due_again(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let id = enqueue_new(&*queue, NewJob::new(source("requeue"), "e", Vec::new())).await;
    // Its worker was killed once before it was given up.
    claim_one(&*queue, LEASE).await;
    past(LEASE).await;
    let job = claim_one(&*queue, LONG).await;
    assert_eq!(job.lapses, 1);
    assert!(queue
        .dead_letter(&job, "bad config")
        .await
        .unwrap()
        .is_applied());
    assert!(queue.requeue(&id).await.unwrap());
    assert!(
        !queue.requeue(&id).await.unwrap(),
        "a pending job was requeued twice"
    );
    let again = claim_one(&*queue, LONG).await;
    assert_eq!(again.id, id);
    assert_eq!((again.attempts, again.lapses), (1, 0));
    assert!(queue
        .dead_letters(100)
        .await
        .unwrap()
        .iter()
        .all(|i| i.id != id));
    assert_eq!(queue.inspect(&id).await.unwrap().unwrap().history.len(), 1);
    assert!(queue.complete(&again).await.unwrap().is_applied());
}

/// Requeue refuses running, completed and unknown jobs.
pub async fn requeue_touches_only_dead_letters(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("requeue-only");
    let running = enqueue_new(&*queue, NewJob::new(&src, "r", Vec::new())).await;
    let job = claim_one(&*queue, LONG).await;
    assert!(!queue.requeue(&running).await.unwrap());
    assert!(queue.complete(&job).await.unwrap().is_applied());
    assert!(!queue.requeue(&running).await.unwrap());
    assert!(!queue.requeue(&JobId::new("999999999")).await.unwrap());
    assert!(!queue.requeue(&JobId::new("nonsense")).await.unwrap());
    assert_eq!(
        queue.inspect(&running).await.unwrap().unwrap().state,
        JobState::Done
    );
}
