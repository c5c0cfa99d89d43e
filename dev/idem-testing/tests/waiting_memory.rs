//! The wake-up scenarios on `MemoryStore`, the reference store.

use std::sync::Arc;

use idem_core::MemoryStore;
use idem_testing::waiting;

#[tokio::test]
async fn a_waiter_on_memory_is_woken_by_a_completion() {
    waiting::a_waiter_is_woken_by_the_store(Arc::new(MemoryStore::new()), "woken").await;
}

#[tokio::test]
async fn no_wake_up_on_memory_is_lost_in_races_between_completion_and_watching() {
    let trials = std::env::var("IDEM_WAIT_RACES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let lost = waiting::lost_wake_ups_in_races(Arc::new(MemoryStore::new()), "race", trials).await;
    assert_eq!(lost, 0, "{lost} of {trials} waiters lost their wake-up");
}
