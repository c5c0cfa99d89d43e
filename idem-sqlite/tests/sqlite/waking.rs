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
