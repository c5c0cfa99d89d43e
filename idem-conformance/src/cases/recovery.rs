//! Recovery through `idem_core::Idempotent` on the store: crashed and
//! stalled owners, takeovers, fencing and the heartbeat.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::State;
use idem_core::{Begin, Error, Fingerprint};
use serde_json::json;
use tokio::time::Instant;

use super::execute::counted;
use crate::support::{idempotent, live, PATIENCE, POLL};
use crate::Factory;

/// A cancelled call keeps the key until its lease lapses; then exactly one
/// of two racing recoverers runs the work.
pub async fn cancelled_call_is_taken_over_by_one_recoverer_after_its_lease(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let idem = idempotent(fixture.store());
    let runs = Arc::new(AtomicUsize::new(0));
    let body = json!("cancelled");
    let calling = Instant::now();
    let (started, work_started) = tokio::sync::oneshot::channel();
    let counter = Arc::clone(&runs);
    let call = idem.execute("cancelled", &body, || async move {
        counter.fetch_add(1, Ordering::SeqCst);
        let _ = started.send(());
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok::<_, String>("never".to_owned())
    });
    // Leaving the select drops the call mid-work, as a crash would.
    tokio::select! {
        outcome = call => panic!("the call was meant to be dropped mid-work, it returned {outcome:?}"),
        _ = work_started => {}
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let blocked = counted(&idem, "cancelled", &body, &runs, "early".to_owned()).await;
    // Only a retry that surely came before the lease could lapse must be
    // refused; a later one may already recover the key.
    if calling.elapsed() < idem.lease() {
        assert!(
            matches!(blocked, Err(Error::InProgress { .. })),
            "a retry right after the cancel got {blocked:?}"
        );
    } else if blocked.is_ok() {
        return;
    }

    let give_up = Instant::now() + PATIENCE;
    loop {
        let (a, b) = tokio::join!(
            counted(&idem, "cancelled", &body, &runs, "a".to_owned()),
            counted(&idem, "cancelled", &body, &runs, "b".to_owned()),
        );
        let answered =
            |r: &Result<String, Error<String>>| matches!(r, Ok(_) | Err(Error::InProgress { .. }));
        assert!(
            answered(&a) && answered(&b),
            "racing recoverers got {a:?} and {b:?}"
        );
        match (&a, &b) {
            // The loser replays the winner's value or is told to wait.
            (Ok(x), Ok(y)) => assert_eq!(x, y, "both racing recoverers ran the work"),
            (Ok(_), _) | (_, Ok(_)) => {}
            _ => {
                assert!(
                    Instant::now() < give_up,
                    "the key was never recovered after the cancelled call's lease"
                );
                tokio::time::sleep(POLL).await;
                continue;
            }
        }
        break;
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the work ran more than once after the takeover"
    );
}

/// A stale owner gets `LeaseLost` from complete, release and renew, and
/// changes nothing.
pub async fn stale_owner_gets_lease_lost_and_changes_nothing(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let idem = idempotent(store.clone());
    let fingerprint = Fingerprint::of_bytes(b"stale");
    let stale = match idem.begin("stale-owner", fingerprint).await {
        Ok(Begin::Run(lease)) => lease,
        other => panic!("the first begin did not claim the key: {other:?}"),
    };
    let give_up = Instant::now() + PATIENCE;
    let heir = loop {
        match idem.begin("stale-owner", fingerprint).await {
            Ok(Begin::Run(lease)) => break lease,
            Err(Error::InProgress { .. }) if Instant::now() < give_up => {
                tokio::time::sleep(POLL).await
            }
            other => panic!("a recoverer got {other:?} instead of taking the key over"),
        }
    };
    assert_ne!(heir.token(), stale.token());
    let key = heir.key().as_str().to_owned();

    assert!(
        matches!(stale.complete(b"\"stale\"").await, Err(Error::LeaseLost)),
        "a stale owner completed"
    );
    assert!(
        matches!(stale.renew().await, Err(Error::LeaseLost)),
        "a stale owner renewed"
    );
    assert!(
        matches!(stale.release().await, Err(Error::LeaseLost)),
        "a stale owner released"
    );
    let record = live(&*store, &key).await;
    assert_eq!(
        (record.token, record.state),
        (heir.token(), State::InFlight),
        "a stale owner changed the record"
    );

    heir.complete(b"\"heir\"")
        .await
        .unwrap_or_else(|e| panic!("the new owner could not complete: {e}"));
    match idem.begin("stale-owner", fingerprint).await {
        Ok(Begin::Replay(replay)) => assert_eq!(replay.payload(), b"\"heir\""),
        other => panic!("after the new owner completed, begin got {other:?}"),
    }
}

/// The heartbeat keeps a lease past its length while work runs: no one
/// takes the key over.
pub async fn heartbeat_keeps_a_lease_past_its_length(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    // Renewals every 200 ms keep a 600 ms lease: a renewal may run 400 ms
    // late on a loaded machine before the lease lapses.
    let lease = Duration::from_millis(600);
    let work = lease * 5 / 2;
    let idem = idempotent(fixture.store()).with_lease(lease);
    let runs = Arc::new(AtomicUsize::new(0));
    let long_work = {
        let (idem, runs) = (idem.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            idem.execute("heartbeat", &"body", || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(work).await;
                Ok::<_, String>("long".to_owned())
            })
            .await
        })
    };
    let until = Instant::now() + work - Duration::from_millis(100);
    tokio::time::sleep(Duration::from_millis(50)).await;
    while Instant::now() < until {
        let probe = counted(
            &idem,
            "heartbeat",
            &json!("body"),
            &runs,
            "intruder".to_owned(),
        )
        .await;
        match probe {
            Err(Error::InProgress { .. }) => {}
            Ok(value) if value == "long" => break,
            other => panic!(
                "a call during long work got {other:?}: the heartbeat did not hold the lease"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outcome = long_work
        .await
        .unwrap_or_else(|e| panic!("the long call panicked: {e}"));
    assert!(
        matches!(&outcome, Ok(value) if value == "long"),
        "the long call got {outcome:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran twice while its owner heartbeat"
    );
}
