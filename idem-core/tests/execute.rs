//! `execute` on `MemoryStore`: runs once, replays, refuses mismatches.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::Runs;
use idem_core::store::Store;
use idem_core::{Error, Idempotent, MemoryStore};
use serde_json::{json, Value};

type Res<T> = Result<T, Error<String>>;

#[tokio::test]
async fn first_call_runs_and_retry_replays_without_running() {
    let idem = Idempotent::new(MemoryStore::new());
    let runs = Runs::default();
    for _ in 0..3 {
        let runs = runs.clone();
        let receipt: Res<Value> = idem
            .execute("order-1", &json!({"amount": 1250}), || async move {
                runs.hit();
                Ok(json!({"charge": "ch_1", "amount": 1250}))
            })
            .await;
        assert_eq!(receipt.unwrap(), json!({"charge": "ch_1", "amount": 1250}));
    }
    assert_eq!(runs.count(), 1);
}

async fn round_trip<T>(idem: &Idempotent, key: &str, value: T) -> (T, T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    let first: Res<T> = idem
        .execute(key, "body", {
            let value = value.clone();
            || async move { Ok(value) }
        })
        .await;
    let replay: Res<T> = idem
        .execute(key, "body", || async { Err("must not run".to_owned()) })
        .await;
    (first.unwrap(), replay.unwrap())
}

#[tokio::test]
async fn replays_falsy_outcomes_exactly() {
    let idem = Idempotent::new(MemoryStore::new());
    assert_eq!(round_trip(&idem, "zero", 0i64).await, (0, 0));
    assert_eq!(round_trip(&idem, "false", false).await, (false, false));
    let (a, b) = round_trip(&idem, "empty", String::new()).await;
    assert_eq!((a.as_str(), b.as_str()), ("", ""));
    let (a, b) = round_trip(&idem, "array", Vec::<u8>::new()).await;
    assert!(a.is_empty() && b.is_empty());
    let (a, b) = round_trip(&idem, "object", json!({})).await;
    assert_eq!((a, b), (json!({}), json!({})));
    let (a, b) = round_trip(&idem, "null", Value::Null).await;
    assert_eq!((a, b), (Value::Null, Value::Null));
    round_trip(&idem, "unit", ()).await;
    let (a, b) = round_trip(&idem, "none", None::<u8>).await;
    assert_eq!((a, b), (None, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_callers_run_the_work_once() {
    let idem = Idempotent::new(MemoryStore::new());
    let runs = Runs::default();
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let callers: Vec<_> = (0..64)
        .map(|_| {
            let (idem, runs, barrier) = (idem.clone(), runs.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                idem.execute("hot-key", &json!({"n": 1}), || async move {
                    runs.hit();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, String>(42u32)
                })
                .await
            })
        })
        .collect();
    let mut replayed_or_ran = 0;
    for caller in callers {
        match caller.await.unwrap() {
            Ok(value) => {
                assert_eq!(value, 42);
                replayed_or_ran += 1;
            }
            Err(Error::InProgress { .. }) => {}
            Err(other) => panic!("unexpected answer: {other}"),
        }
    }
    assert_eq!(runs.count(), 1);
    assert!(replayed_or_ran >= 1);
}

#[tokio::test]
async fn different_body_under_a_completed_key_is_a_mismatch() {
    let idem = Idempotent::new(MemoryStore::new());
    let runs = Runs::default();
    let first: Res<u32> = idem
        .execute("k", &json!({"amount": 1}), || async { Ok(1) })
        .await;
    assert_eq!(first.unwrap(), 1);
    let runs2 = runs.clone();
    let second: Res<u32> = idem
        .execute("k", &json!({"amount": 2}), || async move {
            runs2.hit();
            Ok(2)
        })
        .await;
    assert!(matches!(second, Err(Error::Mismatch)), "{second:?}");
    assert_eq!(runs.count(), 0);
}

#[tokio::test]
async fn mismatch_wins_over_in_progress() {
    let idem = Idempotent::new(MemoryStore::new());
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let owner = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.execute("k", &json!({"amount": 1}), || async move {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok::<_, String>(1u32)
            })
            .await
        }
    });
    started.await.unwrap();
    let same: Res<u32> = idem
        .execute("k", &json!({"amount": 1}), || async { Ok(9) })
        .await;
    assert!(matches!(same, Err(Error::InProgress { .. })), "{same:?}");
    let other: Res<u32> = idem
        .execute("k", &json!({"amount": 2}), || async { Ok(9) })
        .await;
    assert!(matches!(other, Err(Error::Mismatch)), "{other:?}");
    finish.send(()).unwrap();
    assert_eq!(owner.await.unwrap().unwrap(), 1);
}

#[tokio::test]
async fn map_bodies_never_mismatch_with_themselves() {
    let idem = Idempotent::new(MemoryStore::new());
    let runs = Runs::default();
    for _ in 0..5 {
        // A fresh HashMap per round: each has its own random iteration order.
        let body: HashMap<String, u32> = (0..200).map(|i| (format!("field-{i}"), i)).collect();
        let runs = runs.clone();
        let out: Res<u32> = idem
            .execute("map-key", &body, || async move {
                runs.hit();
                Ok(7)
            })
            .await;
        assert_eq!(out.unwrap(), 7);
    }
    assert_eq!(runs.count(), 1);
    let reordered: Value = serde_json::from_str(r#"{"b": 2, "a": {"y": 1, "x": 0}}"#).unwrap();
    let ordered = json!({"a": {"x": 0, "y": 1}, "b": 2});
    let _: u8 = idem
        .execute("order", &reordered, || async { Ok::<_, String>(1) })
        .await
        .unwrap();
    let replay: Res<u8> = idem.execute("order", &ordered, || async { Ok(2) }).await;
    assert_eq!(replay.unwrap(), 1);
}

#[tokio::test]
async fn work_error_releases_the_key_and_a_retry_runs_again() {
    let idem = Idempotent::new(MemoryStore::new());
    let runs = Runs::default();
    let r = runs.clone();
    let failed: Res<u32> = idem
        .execute("k", "b", || async move {
            r.hit();
            Err("gateway timeout".to_owned())
        })
        .await;
    assert!(matches!(failed, Err(Error::Work(ref e)) if e == "gateway timeout"));
    let r = runs.clone();
    let retried: Res<u32> = idem
        .execute("k", "b", || async move {
            r.hit();
            Ok(5)
        })
        .await;
    assert_eq!(retried.unwrap(), 5);
    assert_eq!(runs.count(), 2);
}

#[tokio::test]
async fn remembered_failure_replays_without_running() {
    let idem = Idempotent::new(MemoryStore::new());
    let runs = Runs::default();
    for _ in 0..3 {
        let r = runs.clone();
        let out: Res<u32> = idem
            .execute_remembering(
                "k",
                "b",
                |e: &String| e.starts_with("declined"),
                || async move {
                    r.hit();
                    Err("declined: insufficient funds".to_owned())
                },
            )
            .await;
        assert!(matches!(out, Err(Error::Work(ref e)) if e == "declined: insufficient funds"));
    }
    assert_eq!(runs.count(), 1);
    // A plain `execute` cannot decode the caller's error type, but still
    // must not run the work: it sees the failure as JSON.
    let plain: Res<u32> = idem.execute("k", "b", || async { Ok(1) }).await;
    assert!(
        matches!(plain, Err(Error::Remembered(Value::String(ref s))) if s.starts_with("declined"))
    );
    assert_eq!(runs.count(), 1);
}

#[tokio::test]
async fn a_failure_not_chosen_for_remembering_is_released() {
    let idem = Idempotent::new(MemoryStore::new());
    let runs = Runs::default();
    for _ in 0..2 {
        let r = runs.clone();
        let _: Res<u32> = idem
            .execute_remembering(
                "k",
                "b",
                |_: &String| false,
                || async move {
                    r.hit();
                    Err("timeout".to_owned())
                },
            )
            .await;
    }
    assert_eq!(runs.count(), 2);
}

#[tokio::test]
async fn an_outcome_that_no_longer_decodes_is_a_decode_error() {
    let idem = Idempotent::new(MemoryStore::new());
    let _: u32 = idem
        .execute("k", "b", || async { Ok::<_, String>(3) })
        .await
        .unwrap();
    let changed: Res<String> = idem.execute("k", "b", || async { Ok("x".into()) }).await;
    assert!(matches!(changed, Err(Error::Decode(_))), "{changed:?}");
}

#[tokio::test]
async fn works_over_a_shared_dyn_store() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let a = Idempotent::new(store.clone());
    let b = Idempotent::from_arc(store.clone());
    let runs = Runs::default();
    let r = runs.clone();
    let first: Res<u8> = a
        .execute("k", "b", || async move {
            r.hit();
            Ok(1)
        })
        .await;
    let second: Res<u8> = b.execute("k", "b", || async { Ok(2) }).await;
    assert_eq!((first.unwrap(), second.unwrap()), (1, 1));
    assert_eq!(runs.count(), 1);
    assert!(store
        .load(a.key("k").unwrap().as_str())
        .await
        .unwrap()
        .is_some());
}

#[tokio::test]
async fn a_waiting_caller_gets_the_outcome_instead_of_in_progress() {
    let idem = Idempotent::new(MemoryStore::new()).with_wait(Duration::from_secs(5));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let owner = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.execute("k", "b", || async move {
                started_tx.send(()).unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, String>(11u32)
            })
            .await
        }
    });
    started.await.unwrap();
    let waited: Res<u32> = idem.execute("k", "b", || async { Ok(99) }).await;
    assert_eq!(waited.unwrap(), 11);
    assert_eq!(owner.await.unwrap().unwrap(), 11);
}
