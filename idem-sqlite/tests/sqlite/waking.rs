//! Waiters woken in process when an outcome commits, including through
//! the transactional completion.

use std::sync::Arc;

use idem_testing::waiting;

use crate::support::fresh;

#[tokio::test]
async fn a_waiter_is_woken_by_a_completion() {
    let (store, _dir, _) = fresh().await;
    waiting::a_waiter_is_woken_by_the_store(Arc::new(store), "woken").await;
}

#[tokio::test]
async fn no_wake_up_is_lost_in_races_between_completion_and_watching() {
    let (store, _dir, _) = fresh().await;
    let trials = trials();
    let lost = waiting::lost_wake_ups_in_races(Arc::new(store), "race", trials).await;
    assert_eq!(lost, 0, "{lost} of {trials} waiters lost their wake-up");
}

/// `IDEM_WAIT_RACES` trials (default 200).
fn trials() -> usize {
    std::env::var("IDEM_WAIT_RACES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200)
}

/// A completion in the caller's transaction wakes the waiter at commit: it
/// polls once an hour, so only the wake-up brings it back within `WOKEN`.
#[tokio::test]
async fn a_waiter_is_woken_by_a_transactional_completion() {
    use idem_core::{Begin, Fingerprint, Idempotent};
    use idem_sqlite::Settle;
    use waiting::{CountingStore, NO_POLLING, WAIT, WOKEN};

    let (store, _dir, _) = fresh().await;
    let counting = CountingStore::new(Arc::new(store.clone()));
    waiting::connected_wakeups(&counting).await;
    let idem = Idempotent::new(counting.clone()).with_wait_polling(NO_POLLING, NO_POLLING);
    let fingerprint = Fingerprint::of_bytes(b"tx");
    let Begin::Run(lease) = idem.begin("tx-woken", fingerprint).await.unwrap() else {
        panic!("the key was fresh");
    };
    let waiter = tokio::spawn({
        let idem = idem.clone().with_wait(WAIT);
        async move { idem.begin("tx-woken", fingerprint).await }
    });
    waiting::until("the waiter is parked", || counting.answered() == 3).await;
    store
        .settle_in_tx(&lease, |_| Settle::Complete(b"12".to_vec()))
        .await
        .unwrap();
    let answer = tokio::time::timeout(WOKEN, waiter)
        .await
        .expect("the waiter was not woken by the transactional completion");
    match answer.unwrap() {
        Ok(Begin::Replay(replay)) => assert_eq!(replay.payload(), b"12"),
        other => panic!("the waiter did not get the outcome: {other:?}"),
    }
    assert_eq!(counting.inserts(), 4, "one read after the wake-up");
}
