//! Whole executions through `idem_core::Idempotent` on the store: replays,
//! mismatches, in-progress answers, released and remembered failures.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{Begin, Error, Fingerprint, Idempotent};
use serde_json::{json, Map, Value};

use crate::support::{idempotent, LONG};
use crate::Factory;

/// Runs `work`'s value through `execute`, counting runs in `runs`.
pub(super) async fn counted<T>(
    idem: &Idempotent,
    key: &str,
    body: &Value,
    runs: &AtomicUsize,
    value: T,
) -> Result<T, Error<String>>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send,
{
    idem.execute(key, body, || async move {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok(value)
    })
    .await
}

/// A retry with the same key and body gets the recorded outcome without
/// running the work again.
pub async fn replays_without_running_the_work_again(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store());
    let runs = AtomicUsize::new(0);
    let body = json!({"amount": 1250, "currency": "EUR"});
    let first = counted(&idem, "replay", &body, &runs, json!({"charge": "ch_1"})).await;
    assert_eq!(first.ok(), Some(json!({"charge": "ch_1"})));
    for _ in 0..3 {
        let again = counted(&idem, "replay", &body, &runs, json!({"charge": "ch_2"})).await;
        assert_eq!(
            again.ok(),
            Some(json!({"charge": "ch_1"})),
            "a retry did not get the recorded outcome"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran again on a retry"
    );
}

/// Falsy outcomes (`0`, `false`, `""`, `[]`, `{}`, `null`, `()`) replay
/// exactly.
pub async fn replays_falsy_outcomes_exactly(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store());
    async fn check<T>(idem: &Idempotent, key: &str, value: T)
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + Clone + PartialEq + Debug,
    {
        let runs = AtomicUsize::new(0);
        let body = json!(key);
        let first = counted(idem, key, &body, &runs, value.clone()).await;
        assert_eq!(
            first.ok().as_ref(),
            Some(&value),
            "the first call did not return its value"
        );
        let again = counted(idem, key, &body, &runs, value.clone()).await;
        match again {
            Ok(replayed) => assert_eq!(
                replayed, value,
                "the falsy outcome {key} replayed as another value"
            ),
            Err(e) => panic!("the falsy outcome {key} did not replay: {e:?}"),
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the falsy outcome {key} was not recorded: the work ran again"
        );
    }
    check(&idem, "falsy-zero", 0i64).await;
    check(&idem, "falsy-false", false).await;
    check(&idem, "falsy-empty-string", String::new()).await;
    check(&idem, "falsy-empty-array", Vec::<u8>::new()).await;
    check(&idem, "falsy-empty-object", Map::new()).await;
    check(&idem, "falsy-null", Value::Null).await;
    check(&idem, "falsy-none", None::<u8>).await;
    check(&idem, "falsy-unit", ()).await;
}

/// The same key with another body after completion is a mismatch, and the
/// work does not run.
pub async fn another_body_after_completion_is_a_mismatch(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store());
    let runs = AtomicUsize::new(0);
    counted(&idem, "mismatch-done", &json!({"amount": 1}), &runs, 1)
        .await
        .ok();
    let other = counted(&idem, "mismatch-done", &json!({"amount": 2}), &runs, 2).await;
    assert!(
        matches!(other, Err(Error::Mismatch)),
        "another body got {other:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran for a mismatched body"
    );
}

/// The same key with another body while the first is in flight is a
/// mismatch, not in progress.
pub async fn another_body_while_in_flight_is_a_mismatch(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store());
    let lease = match idem
        .begin("mismatch-in-flight", Fingerprint::of_bytes(b"first"))
        .await
    {
        Ok(Begin::Run(lease)) => lease,
        other => panic!("the first begin did not claim the key: {other:?}"),
    };
    let runs = AtomicUsize::new(0);
    let other = counted(&idem, "mismatch-in-flight", &json!("second"), &runs, 0).await;
    assert!(
        matches!(other, Err(Error::Mismatch)),
        "another body under an in-flight key got {other:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    drop(lease);
}

/// The same body while the first call is in flight is in progress, with a
/// retry hint no longer than the lease.
pub async fn same_body_while_in_flight_is_in_progress(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store()).with_lease(LONG);
    let body = json!({"order": 7});
    let fingerprint = Fingerprint::of_json(&body).unwrap_or_else(|e| panic!("{e}"));
    let _lease = match idem.begin("in-progress", fingerprint).await {
        Ok(Begin::Run(lease)) => lease,
        other => panic!("the first begin did not claim the key: {other:?}"),
    };
    let runs = AtomicUsize::new(0);
    match counted(&idem, "in-progress", &body, &runs, 0).await {
        Err(Error::InProgress { retry_after }) => assert!(
            !retry_after.is_zero() && retry_after <= idem.lease(),
            "in progress with a retry hint of {retry_after:?} for a {:?} lease",
            idem.lease()
        ),
        other => panic!("a retry under an in-flight key got {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the work ran under a live lease"
    );
}

/// An error from the work releases the key: the next call runs again.
pub async fn released_errors_run_again(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store());
    let runs = AtomicUsize::new(0);
    let failed = idem
        .execute("released", &"body", || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<u32, _>("gateway timeout".to_owned())
        })
        .await;
    assert!(
        matches!(&failed, Err(Error::Work(e)) if e == "gateway timeout"),
        "got {failed:?}"
    );
    let retried = counted(&idem, "released", &json!("body"), &runs, 5u32).await;
    assert_eq!(
        retried.ok(),
        Some(5),
        "a retry after a released error did not run the work"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A failure the caller chose to remember replays as the same error
/// without running the work.
pub async fn remembered_failures_replay(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store());
    let runs = AtomicUsize::new(0);
    let declined = json!({"code": "card_declined", "detail": ""});
    for _ in 0..2 {
        let outcome = idem
            .execute_remembering(
                "remembered",
                &"body",
                |_: &Value| true,
                || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<u32, _>(declined.clone())
                },
            )
            .await;
        assert!(
            matches!(&outcome, Err(Error::Work(e)) if *e == declined),
            "got {outcome:?}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a remembered failure ran the work again"
    );
}

/// The same client key in different scopes names different records.
pub async fn scopes_are_isolated(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store());
    let runs = AtomicUsize::new(0);
    let tenants = [("a", "b:c"), ("a:b", "c"), ("b", "b:c"), ("", "b:c")];
    for (scope, key) in tenants {
        let scoped = idem.scoped(scope);
        let got = counted(
            &scoped,
            key,
            &json!("same body"),
            &runs,
            format!("{scope}/{key}"),
        )
        .await;
        assert_eq!(
            got.ok(),
            Some(format!("{scope}/{key}")),
            "scope {scope:?} key {key:?} got another tenant's outcome"
        );
    }
    for (scope, key) in tenants {
        let got = counted(
            &idem.scoped(scope),
            key,
            &json!("same body"),
            &runs,
            String::new(),
        )
        .await;
        assert_eq!(
            got.ok(),
            Some(format!("{scope}/{key}")),
            "scope {scope:?} key {key:?} replayed another tenant's outcome"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), tenants.len());
}
