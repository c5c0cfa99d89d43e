//! Leases: a lapsed lease frees the job, a heartbeat keeps it, and a late
//! worker is fenced out once another holds the job.

use std::time::Duration;

use tokio::time::Instant;

use super::super::support::{claim, claim_one, enqueue_new, past, settled, source, LEASE, LONG};
use super::super::QueueFactory;
use crate::queue::{JobState, NewJob, Settle};

/// A job whose worker vanished is claimed again once its lease lapses; the
/// claim counts a lapse and carries on the attempt that lapsed.
pub async fn lapsed_lease_makes_the_job_claimable_again(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    enqueue_new(&*queue, NewJob::new(source("lapse"), "e", Vec::new())).await;
    let began = Instant::now();
    let crashed = claim_one(&*queue, LEASE).await;
    let early = claim(&*queue, 1, LONG).await;
    if began.elapsed() < LEASE {
        assert!(early.is_empty(), "a job was claimed under a live lease");
    }
    let heir = claim_one(&*queue, LONG).await;
    assert_eq!(heir.id, crashed.id);
    assert_ne!(heir.token, crashed.token);
    assert_eq!(
        (crashed.attempts, crashed.lapses),
        (1, 0),
        "a first claim's counts"
    );
    assert_eq!(
        (heir.attempts, heir.lapses),
        (1, 1),
        "a claim after a lapsed lease must count a lapse, not an attempt"
    );
}

/// Lapses and attempts are counted apart through every transition: kills
/// add lapses only, a release gives back the attempt its claim carried,
/// a retry keeps both, and inspection shows them.
pub async fn lapses_and_attempts_are_counted_apart(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let id = enqueue_new(&*queue, NewJob::new(source("lapses"), "e", Vec::new())).await;
    // Three workers killed holding it.
    let mut job = claim_one(&*queue, LEASE).await;
    for lapse in 1..=3 {
        past(LEASE).await;
        job = claim_one(&*queue, LEASE).await;
        assert_eq!(
            (job.attempts, job.lapses),
            (1, lapse),
            "after {lapse} kills"
        );
    }
    // The last one is released unrun: its attempt is given back.
    assert_eq!(
        settled(queue.release(&job).await, "release"),
        Settle::Applied
    );
    let info = queue.inspect(&id).await.unwrap().unwrap();
    assert_eq!((info.attempts, info.lapses), (0, 3), "after the release");
    let job = claim_one(&*queue, LONG).await;
    assert_eq!(
        (job.attempts, job.lapses),
        (1, 3),
        "the claim after a release"
    );
    assert_eq!(
        settled(queue.retry(&job, Duration::ZERO, "failed").await, "retry"),
        Settle::Applied
    );
    let job = claim_one(&*queue, LONG).await;
    assert_eq!(
        (job.attempts, job.lapses),
        (2, 3),
        "the claim after a retry"
    );
    let info = queue.inspect(&id).await.unwrap().unwrap();
    assert_eq!((info.attempts, info.lapses), (2, 3), "inspect");
    assert_eq!(
        settled(queue.complete(&job).await, "complete"),
        Settle::Applied
    );
}

/// Heartbeats keep a job held well past its original lease.
pub async fn heartbeat_keeps_a_job_past_its_lease(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    enqueue_new(&*queue, NewJob::new(source("beat"), "e", Vec::new())).await;
    let job = claim_one(&*queue, LEASE).await;
    let until = Instant::now() + LEASE * 3;
    while Instant::now() < until {
        let beat = queue.heartbeat(&job, LEASE).await;
        assert_eq!(settled(beat, "heartbeat"), Settle::Applied);
        assert!(
            claim(&*queue, 1, LONG).await.is_empty(),
            "a heartbeating job was claimed"
        );
        tokio::time::sleep(LEASE / 4).await;
    }
    assert_eq!(
        settled(queue.complete(&job).await, "complete"),
        Settle::Applied
    );
}

/// Once another worker holds the job, nothing the late worker does applies.
pub async fn late_worker_cannot_settle_a_job_another_now_holds(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let id = enqueue_new(&*queue, NewJob::new(source("late"), "e", Vec::new())).await;
    let late = claim_one(&*queue, LEASE).await;
    let holder = claim_one(&*queue, LONG).await;
    assert_eq!(holder.id, late.id);
    assert_eq!(
        settled(queue.heartbeat(&late, LONG).await, "heartbeat"),
        Settle::LeaseLost
    );
    assert_eq!(
        settled(queue.complete(&late).await, "complete"),
        Settle::LeaseLost
    );
    assert_eq!(
        settled(queue.retry(&late, Duration::ZERO, "late").await, "retry"),
        Settle::LeaseLost
    );
    assert_eq!(
        settled(queue.release(&late).await, "release"),
        Settle::LeaseLost
    );
    assert_eq!(
        settled(queue.dead_letter(&late, "late").await, "dead_letter"),
        Settle::LeaseLost
    );
    let info = queue.inspect(&id).await.unwrap().unwrap();
    assert_eq!(info.state, JobState::Running, "a late worker moved the job");
    assert!(info.history.is_empty(), "a late worker wrote history");
    assert!(
        claim(&*queue, 1, LONG).await.is_empty(),
        "a late worker freed the job"
    );
    assert_eq!(
        settled(queue.complete(&holder).await, "complete"),
        Settle::Applied
    );
}

/// A worker whose lease lapsed may still settle while nobody took the job.
pub async fn late_worker_settles_when_nobody_took_over(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let id = enqueue_new(&*queue, NewJob::new(source("late-alone"), "e", Vec::new())).await;
    let late = claim_one(&*queue, LEASE).await;
    past(LEASE).await;
    assert_eq!(
        settled(queue.complete(&late).await, "complete"),
        Settle::Applied
    );
    assert_eq!(
        queue.inspect(&id).await.unwrap().unwrap().state,
        JobState::Done
    );
    assert!(claim(&*queue, 1, LONG).await.is_empty());
}
