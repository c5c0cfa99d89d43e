//! Enqueueing: one job per (source, event id).

use std::time::Duration;

use tokio::time::Instant;

use super::super::support::{claim, claim_one, enqueue_new, settled, source, LONG};
use super::super::QueueFactory;
use crate::queue::{Enqueued, NewJob, Settle};

/// A claimed job carries what was enqueued, byte for byte, and attempt 1.
pub async fn enqueued_job_is_claimed_with_its_fields(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("fields");
    let payload: Vec<u8> = (0..=255u8).chain([0, 0, 255]).collect();
    let id = enqueue_new(&*queue, NewJob::new(&src, "evt ✓/1", payload.clone())).await;
    let job = claim_one(&*queue, LONG).await;
    assert_eq!(job.id, id);
    assert_eq!(job.source, src);
    assert_eq!(job.event_id, "evt ✓/1");
    assert_eq!(job.payload, payload, "the payload did not round-trip");
    assert_eq!(job.attempts, 1);
    assert_eq!(job.last_error, None);
    assert!(
        !job.token.as_bytes().is_empty(),
        "a claim gave an empty token"
    );
}

/// Enqueueing an event the queue holds adds nothing and names the held job.
pub async fn duplicate_event_is_reported_and_queued_once(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("dup");
    let id = enqueue_new(&*queue, NewJob::new(&src, "e1", b"first".to_vec())).await;
    for payload in [b"first".to_vec(), b"altered".to_vec()] {
        let again = queue
            .enqueue(NewJob::new(&src, "e1", payload))
            .await
            .unwrap();
        assert_eq!(again, Enqueued::Duplicate(id.clone()));
    }
    let jobs = claim(&*queue, 10, LONG).await;
    assert_eq!(jobs.len(), 1, "a duplicate was queued: {jobs:?}");
    assert_eq!(
        jobs[0].payload, b"first",
        "a duplicate replaced the payload"
    );
    // Still a duplicate while held.
    let held = queue
        .enqueue(NewJob::new(&src, "e1", b"x".to_vec()))
        .await
        .unwrap();
    assert_eq!(held, Enqueued::Duplicate(id));
}

/// A job is a duplicate of the held job one of its dedupe keys names, under
/// any event id; a job held by its id alone gains the keys it comes with.
pub async fn dedupe_key_makes_another_event_id_a_duplicate(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("keys");
    let keyed = enqueue_new(
        &*queue,
        NewJob::new(&src, "e1", b"a".to_vec()).with_dedupe_key("k1"),
    )
    .await;
    let again = queue
        .enqueue(NewJob::new(&src, "e2", b"a".to_vec()).with_dedupe_key("k1"))
        .await
        .unwrap();
    assert_eq!(
        again,
        Enqueued::Duplicate(keyed.clone()),
        "a held dedupe key was missed"
    );
    // Held by its id only (as an earlier build queued it): the key it is
    // enqueued with again names it from then on.
    let plain = enqueue_new(&*queue, NewJob::new(&src, "e3", b"b".to_vec())).await;
    let by_id = queue
        .enqueue(NewJob::new(&src, "e3", b"b".to_vec()).with_dedupe_key("k3"))
        .await
        .unwrap();
    assert_eq!(by_id, Enqueued::Duplicate(plain.clone()));
    let by_key = queue
        .enqueue(NewJob::new(&src, "e4", b"b".to_vec()).with_dedupe_key("k3"))
        .await
        .unwrap();
    assert_eq!(
        by_key,
        Enqueued::Duplicate(plain),
        "the key was not remembered"
    );
    // Another key, or the same key from another source, is another job.
    enqueue_new(
        &*queue,
        NewJob::new(&src, "e5", b"c".to_vec()).with_dedupe_key("k5"),
    )
    .await;
    enqueue_new(
        &*queue,
        NewJob::new(source("keys"), "e6", b"a".to_vec()).with_dedupe_key("k1"),
    )
    .await;
    assert_eq!(claim(&*queue, 10, LONG).await.len(), 4);
}

/// The dedupe key is the pair: one event id under two sources is two jobs.
pub async fn same_event_id_from_another_source_is_another_job(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let (a, b) = (source("a"), source("b"));
    let first = enqueue_new(&*queue, NewJob::new(&a, "42", b"a".to_vec())).await;
    let second = enqueue_new(&*queue, NewJob::new(&b, "42", b"b".to_vec())).await;
    assert_ne!(first, second);
    assert_eq!(claim(&*queue, 10, LONG).await.len(), 2);
}

/// A completed event is still recognised, well within the retention.
pub async fn completed_event_is_still_a_duplicate(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("done-dup");
    let id = enqueue_new(&*queue, NewJob::new(&src, "e", b"p".to_vec())).await;
    let job = claim_one(&*queue, LONG).await;
    assert_eq!(
        settled(queue.complete(&job).await, "complete"),
        Settle::Applied
    );
    let again = queue
        .enqueue(NewJob::new(&src, "e", b"p".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        again,
        Enqueued::Duplicate(id),
        "a completed event was queued again"
    );
    assert!(claim(&*queue, 10, LONG).await.is_empty());
}

/// A job enqueued with a delay is not due before it, and is due after.
pub async fn delayed_job_is_not_due_before_its_delay(factory: &dyn QueueFactory) {
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let delay = Duration::from_millis(400);
    let began = Instant::now();
    enqueue_new(
        &*queue,
        NewJob::new(source("delay"), "e", b"p".to_vec()).with_delay(delay),
    )
    .await;
    let early = claim(&*queue, 10, LONG).await;
    if began.elapsed() < delay {
        assert!(early.is_empty(), "a delayed job was claimed early");
    }
    claim_one(&*queue, LONG).await;
    assert!(
        began.elapsed() >= delay - Duration::from_millis(20),
        "due too early"
    );
}

/// Concurrent deliveries of the same events — what a receiver under load
/// meets, and what a backend that groups commits must keep apart — queue
/// each event once: one `New` per event, every duplicate naming that job,
/// every job claimable with its first payload.
pub async fn concurrent_enqueues_queue_each_event_once(factory: &dyn QueueFactory) {
    const EVENTS: usize = 20;
    const SENDERS: usize = 16;
    let fixture = factory.fixture().await;
    let queue = fixture.queue();
    let src = source("burst");
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..SENDERS {
        let (queue, src) = (queue.clone(), src.clone());
        senders.spawn(async move {
            let mut answers = Vec::new();
            // Every sender delivers every event, starting at its own place.
            for n in (0..EVENTS).map(|n| (n + sender) % EVENTS) {
                let job = NewJob::new(&src, format!("e{n}"), format!("p{n}").into_bytes());
                let answer = queue.enqueue(job).await.expect("enqueue");
                answers.push((n, answer));
            }
            answers
        });
    }
    let mut new = std::collections::HashMap::new();
    let mut duplicates = Vec::new();
    while let Some(answers) = senders.join_next().await {
        for (n, answer) in answers.expect("a sender panicked") {
            match answer {
                Enqueued::New(id) => {
                    assert!(new.insert(n, id).is_none(), "event {n} was queued twice");
                }
                Enqueued::Duplicate(id) => duplicates.push((n, id)),
            }
        }
    }
    assert_eq!(new.len(), EVENTS, "some event was never queued");
    assert_eq!(duplicates.len(), EVENTS * (SENDERS - 1));
    for (n, id) in duplicates {
        assert_eq!(
            Some(&id),
            new.get(&n),
            "a duplicate of e{n} named another job"
        );
    }
    let jobs = claim(&*queue, EVENTS * 2, LONG).await;
    assert_eq!(jobs.len(), EVENTS, "the queue holds another number of jobs");
    for job in jobs {
        let n: usize = job.event_id[1..].parse().expect("an event of this case");
        assert_eq!(job.id, new[&n]);
        assert_eq!(job.payload, format!("p{n}").into_bytes());
    }
}
