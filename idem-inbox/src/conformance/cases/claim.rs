//! Claiming: batches, exclusivity, tokens and attempts.

use std::collections::HashSet;
use std::sync::Arc;

use super::super::support::{claim, claim_one, enqueue_new, settled, source, LONG};
use super::super::QueueFactory;
use crate::queue::{NewJob, Settle};

/// A claim returns at most its batch size, and no job twice.
pub async fn claim_returns_at_most_the_batch_and_each_job_once(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("batch");
    for n in 0..10 {
        enqueue_new(&*queue, NewJob::new(&src, n.to_string(), vec![n])).await;
    }
    let first = claim(&*queue, 4, LONG).await;
    let second = claim(&*queue, 100, LONG).await;
    let third = claim(&*queue, 100, LONG).await;
    assert_eq!((first.len(), second.len(), third.len()), (4, 6, 0));
    let ids: HashSet<_> = first.iter().chain(&second).map(|j| j.id.clone()).collect();
    assert_eq!(ids.len(), 10, "a job was claimed twice");
}

/// Concurrent claimers take disjoint sets that together hold every job.
pub async fn concurrent_claims_never_share_a_job(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("race");
    const JOBS: usize = 60;
    for n in 0..JOBS {
        enqueue_new(&*queue, NewJob::new(&src, n.to_string(), Vec::new())).await;
    }
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let queue = Arc::clone(&queue);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = claim(&*queue, 3, LONG).await;
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.into_iter().map(|j| j.event_id));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), all.len(), "two claimers got one job");
    assert_eq!(all.len(), JOBS, "a job was never claimed");
}

/// Each claim of one job gives a new token and counts one more attempt.
pub async fn every_claim_gets_a_new_token_and_attempt(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    enqueue_new(&*queue, NewJob::new(source("tokens"), "e", Vec::new())).await;
    let mut tokens = HashSet::new();
    for attempt in 1..=3 {
        let job = claim_one(&*queue, LONG).await;
        assert_eq!(job.attempts, attempt);
        assert!(tokens.insert(job.token.clone()), "a claim reused a token");
        let retried = queue.retry(&job, std::time::Duration::ZERO, "again").await;
        assert_eq!(settled(retried, "retry"), Settle::Applied);
    }
}

/// A claim of zero jobs takes none.
pub async fn zero_batch_claims_nothing(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    enqueue_new(&*queue, NewJob::new(source("zero"), "e", Vec::new())).await;
    assert!(claim(&*queue, 0, LONG).await.is_empty());
    assert_eq!(claim(&*queue, 1, LONG).await.len(), 1);
}
