//! What durable steps rest on: an `InFlight` record's payload (the step
//! journal) round-trips through `swap` and `take_over`, a `swap` may write
//! a new token (the token rotates at every recorded step), and a whole
//! durable run resumes after its owner is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{NewRecord, State, Token};
use idem_core::Error;
use tokio::time::Instant;

use crate::support::{claim, fp, idempotent, in_flight, key, live, ok, LONG, PATIENCE, POLL};
use crate::Factory;

/// An `InFlight` swap keeps its payload, writes its new token, and the old
/// token no longer matches.
pub async fn in_flight_swap_keeps_its_payload_and_rotates_the_token(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("steps-rotate");
    let first = Token::random();
    claim(&*store, &key, &in_flight(first, fp(1), LONG)).await;
    let second = Token::random();
    let journal = br#"{"idem_steps":1,"steps":[{"name":"a","outcome":0}]}"#;
    let step = NewRecord {
        token: second,
        payload: journal,
        ..in_flight(second, fp(1), LONG)
    };
    assert!(
        ok(store.swap(&key, first, &step).await, "swap"),
        "the owner's in-flight swap to a new token was refused"
    );
    let record = live(&*store, &key).await;
    assert_eq!(record.state, State::InFlight);
    assert_eq!(
        record.token, second,
        "swap did not write the record's new token"
    );
    assert_eq!(
        record.payload, journal,
        "an InFlight record's payload did not round-trip"
    );
    assert!(record.lease_remaining.is_some_and(|l| l > LONG / 2));
    let stale = in_flight(first, fp(1), LONG);
    assert!(
        !ok(store.swap(&key, first, &stale).await, "swap"),
        "the token replaced by a rotation still matched"
    );
    assert_eq!(live(&*store, &key).await.payload, journal);
}

/// `take_over` writes the payload it is given on the new owner's record.
pub async fn take_over_writes_the_payload_it_is_given(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("steps-take-over");
    let owner = Token::random();
    claim(
        &*store,
        &key,
        &in_flight(owner, fp(1), Duration::from_millis(100)),
    )
    .await;
    let heir = Token::random();
    let journal = br#"{"idem_steps":1,"takeovers":1,"steps":[]}"#;
    let record = NewRecord {
        payload: journal,
        ..in_flight(heir, fp(1), LONG)
    };
    let give_up = Instant::now() + PATIENCE;
    while !ok(store.take_over(&key, owner, &record).await, "take_over") {
        assert!(Instant::now() < give_up, "take_over never succeeded");
        tokio::time::sleep(POLL).await;
    }
    let found = live(&*store, &key).await;
    assert_eq!((found.token, found.state), (heir, State::InFlight));
    assert_eq!(
        found.payload, journal,
        "take_over lost the payload it was given"
    );
}

/// A durable run dropped after its first step resumes after it: the
/// recorded step does not run again, the rest run once.
pub async fn durable_steps_resume_after_the_owner_is_dropped(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store()).with_lease(Duration::from_millis(200));
    let runs: Arc<[AtomicUsize; 2]> = Arc::default();
    let work = |crash: bool| {
        let runs = Arc::clone(&runs);
        move |steps: idem_core::Steps| async move {
            let r = Arc::clone(&runs);
            let a: u32 = steps
                .step("a", || async move {
                    r[0].fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(1)
                })
                .await?;
            if crash {
                std::future::pending::<()>().await;
            }
            let b: u32 = steps
                .step("b", || async move {
                    runs[1].fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(2)
                })
                .await?;
            Ok::<u32, Error<String>>(a + b)
        }
    };
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        idem.execute_steps("steps-resume", "body", work(true)),
    )
    .await;
    assert!(dropped.is_err(), "the first run was not dropped");
    let give_up = Instant::now() + PATIENCE;
    let total = loop {
        match idem
            .execute_steps("steps-resume", "body", work(false))
            .await
        {
            Err(Error::InProgress { .. }) if Instant::now() < give_up => {
                tokio::time::sleep(POLL).await
            }
            other => break other,
        }
    };
    assert_eq!(total.expect("the resumed run failed"), 3);
    let counts = [0, 1].map(|i| runs[i].load(Ordering::SeqCst));
    assert_eq!(
        counts,
        [1, 1],
        "a recorded step ran again, or a step ran twice"
    );
}
