//! Waiting for a key in progress (`with_wait`): a waiter is bounded only by
//! its own deadline, on tokio's paused clock (`MemoryStore` keeps tokio
//! time), so multi-second scenarios run without sleeping for real.

mod common;

use std::time::Duration;

use common::Runs;
use idem_core::{Error, Idempotent, MemoryStore};
use tokio::time::Instant;

type Res<T> = Result<T, Error<String>>;

/// Starts an owner whose work takes `work` and returns 11, and returns once
/// it holds the key.
async fn owner(
    idem: &Idempotent,
    work: Duration,
    runs: &Runs,
) -> tokio::task::JoinHandle<Res<u32>> {
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let (idem, runs) = (idem.clone(), runs.clone());
        async move {
            idem.execute("k", "b", || async move {
                runs.hit();
                started_tx.send(()).unwrap();
                tokio::time::sleep(work).await;
                Ok(11)
            })
            .await
        }
    });
    started.await.unwrap();
    task
}

// Pins the defect where a waiter gave up after a fixed number of polls
// (about 0.8 s) whatever its wait, with `InProgress` and a full lease left.
#[tokio::test(start_paused = true)]
async fn a_waiter_outlasts_work_of_several_seconds_and_gets_its_outcome() {
    for work in [Duration::from_millis(1500), Duration::from_secs(3)] {
        let idem = Idempotent::new(MemoryStore::new()).with_wait(Duration::from_secs(5));
        let runs = Runs::default();
        let owner = owner(&idem, work, &runs).await;
        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let waited: Res<u32> = idem
            .execute("k", "b", || async {
                runs.hit();
                Ok(99)
            })
            .await;
        assert_eq!(waited.unwrap(), 11, "after {work:?} of work");
        let took = start.elapsed();
        assert!(took >= work, "got the outcome before it existed: {took:?}");
        // The backoff is capped at 250 ms, so the outcome is seen soon after
        // it is recorded.
        assert!(
            took <= work + Duration::from_millis(260),
            "saw the outcome late: {took:?}"
        );
        assert_eq!(owner.await.unwrap().unwrap(), 11);
        assert_eq!(runs.count(), 1, "the work ran once");
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_deadline_is_shorter_than_the_work_gets_in_progress_at_its_deadline() {
    let idem = Idempotent::new(MemoryStore::new()).with_lease(Duration::from_secs(60));
    let runs = Runs::default();
    let owner = owner(&idem, Duration::from_secs(3), &runs).await;
    let start = Instant::now();
    let wait = Duration::from_millis(1200);
    let waited: Res<u32> = idem
        .clone()
        .with_wait(wait)
        .execute("k", "b", || async { Ok(99) })
        .await;
    let took = start.elapsed();
    match waited {
        Err(Error::InProgress { retry_after }) => {
            assert!(retry_after > Duration::from_secs(50), "{retry_after:?}");
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    assert!(took >= wait, "gave up early: {took:?}");
    assert!(
        took <= wait + Duration::from_millis(5),
        "gave up late: {took:?}"
    );
    assert_eq!(owner.await.unwrap().unwrap(), 11);
    assert_eq!(runs.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_takes_over_from_a_crashed_owner_once_its_lease_lapses() {
    let lease = Duration::from_secs(2);
    let idem = Idempotent::new(MemoryStore::new()).with_lease(lease);
    let runs = Runs::default();
    // The owner crashes: its future is dropped mid-work, leaving the key
    // claimed until the lease lapses.
    let crashed = owner(&idem, Duration::from_secs(3600), &runs).await;
    crashed.abort();
    assert!(crashed.await.unwrap_err().is_cancelled());

    let start = Instant::now();
    let waited: Res<u32> = idem
        .clone()
        .with_wait(Duration::from_secs(10))
        .execute("k", "b", || async {
            runs.hit();
            Ok(22)
        })
        .await;
    assert_eq!(waited.unwrap(), 22, "the waiter ran the work itself");
    let took = start.elapsed();
    assert!(took >= lease, "took over a live lease: {took:?}");
    assert!(took <= lease + Duration::from_millis(260), "{took:?}");
    assert_eq!(runs.count(), 2, "the crashed run and the waiter's");
    let replay: Res<u32> = idem.execute("k", "b", || async { Ok(33) }).await;
    assert_eq!(replay.unwrap(), 22);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_deadline_ends_before_a_crashed_owners_lease_gets_in_progress() {
    let idem = Idempotent::new(MemoryStore::new()).with_lease(Duration::from_secs(5));
    let runs = Runs::default();
    let crashed = owner(&idem, Duration::from_secs(3600), &runs).await;
    crashed.abort();
    let _ = crashed.await;

    let waited: Res<u32> = idem
        .clone()
        .with_wait(Duration::from_secs(2))
        .execute("k", "b", || async {
            runs.hit();
            Ok(22)
        })
        .await;
    assert!(
        matches!(waited, Err(Error::InProgress { retry_after }) if retry_after <= Duration::from_secs(3)),
        "{waited:?}"
    );
    assert_eq!(runs.count(), 1, "the waiter did not run the work");
}
