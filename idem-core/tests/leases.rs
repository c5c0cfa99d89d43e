//! Leases, takeovers, fencing and retention on `MemoryStore`, on tokio's
//! paused clock where the scenario allows it.

mod common;

use std::time::Duration;

use common::Runs;
use idem_core::store::State;
use idem_core::{Begin, Error, Fingerprint, Idempotent, MemoryStore};

type Res<T> = Result<T, Error<String>>;

const LEASE: Duration = Duration::from_secs(10);

fn idem() -> Idempotent {
    Idempotent::new(MemoryStore::new()).with_lease(LEASE)
}

async fn record_state(idem: &Idempotent, key: &str) -> Option<(State, Vec<u8>)> {
    let key = idem.key(key).unwrap();
    idem.store()
        .load(key.as_str())
        .await
        .unwrap()
        .map(|r| (r.state, r.payload))
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_keeps_its_lease_until_it_lapses_then_one_retry_takes_over() {
    let idem = idem();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let crashed = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.execute("k", "b", || async move {
                started_tx.send(()).unwrap();
                std::future::pending::<Result<u32, String>>().await
            })
            .await
        }
    });
    started.await.unwrap();
    crashed.abort();
    assert!(crashed.await.unwrap_err().is_cancelled());

    let early: Res<u32> = idem.execute("k", "b", || async { Ok(1) }).await;
    assert!(matches!(early, Err(Error::InProgress { .. })), "{early:?}");
    assert_eq!(
        record_state(&idem, "k").await.map(|(s, _)| s),
        Some(State::InFlight)
    );

    tokio::time::advance(LEASE + Duration::from_millis(1)).await;
    let runs = Runs::default();
    let recover = |value: u32| {
        let (idem, runs) = (idem.clone(), runs.clone());
        async move {
            idem.execute("k", "b", || async move {
                runs.hit();
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, String>(value)
            })
            .await
        }
    };
    let (a, b) = tokio::join!(recover(1), recover(2));
    assert_eq!(runs.count(), 1, "two recoverers both ran: {a:?} {b:?}");
    let won = [&a, &b].iter().filter(|r| r.is_ok()).count();
    let blocked = [&a, &b]
        .iter()
        .filter(|r| matches!(r, Err(Error::InProgress { .. })))
        .count();
    assert_eq!((won, blocked), (1, 1), "{a:?} {b:?}");
}

#[tokio::test(start_paused = true)]
async fn a_stale_owner_cannot_complete_release_or_renew() {
    let idem = idem();
    let fingerprint = Fingerprint::of_bytes(b"request");
    let Begin::Run(stale) = idem.begin("k", fingerprint).await.unwrap() else {
        panic!("fresh key must be claimed");
    };
    // The owner stalls past its lease: no heartbeat runs.
    tokio::time::advance(LEASE + Duration::from_millis(1)).await;
    let Begin::Run(fresh) = idem.begin("k", fingerprint).await.unwrap() else {
        panic!("a lapsed lease must be taken over");
    };
    assert_ne!(stale.token(), fresh.token());

    assert!(matches!(stale.renew().await, Err(Error::LeaseLost)));
    assert!(matches!(
        stale.complete(b"stale").await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(stale.fail(b"stale").await, Err(Error::LeaseLost)));
    assert!(matches!(stale.release().await, Err(Error::LeaseLost)));
    assert_eq!(
        record_state(&idem, "k").await,
        Some((State::InFlight, Vec::new()))
    );

    fresh.complete(b"fresh").await.unwrap();
    assert!(matches!(
        stale.complete(b"stale").await,
        Err(Error::LeaseLost)
    ));
    assert_eq!(
        record_state(&idem, "k").await,
        Some((State::Completed, b"fresh".to_vec()))
    );
    match idem.begin("k", fingerprint).await.unwrap() {
        Begin::Replay(replay) => assert_eq!(replay.payload(), b"fresh"),
        other => panic!("expected a replay, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_a_long_work_lease_well_past_its_length() {
    let idem = idem();
    let runs = Runs::default();
    let owner = tokio::spawn({
        let (idem, runs) = (idem.clone(), runs.clone());
        async move {
            idem.execute("k", "b", || async move {
                runs.hit();
                tokio::time::sleep(LEASE * 6).await;
                Ok::<_, String>(1u8)
            })
            .await
        }
    });
    for _ in 0..5 {
        tokio::time::sleep(LEASE).await;
        let probe: Res<u8> = idem.execute("k", "b", || async { Ok(2) }).await;
        assert!(matches!(probe, Err(Error::InProgress { .. })), "{probe:?}");
    }
    assert_eq!(owner.await.unwrap().unwrap(), 1);
    assert_eq!(runs.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn once_retention_lapses_the_key_runs_again_as_new() {
    let idem = idem().with_retention(Duration::from_secs(60));
    let runs = Runs::default();
    let call = || {
        let (idem, runs) = (idem.clone(), runs.clone());
        async move {
            idem.execute("k", "b", || async move {
                runs.hit();
                Ok::<_, String>(runs.count())
            })
            .await
        }
    };
    assert_eq!(call().await.unwrap(), 1);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(call().await.unwrap(), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(call().await.unwrap(), 2);
    assert_eq!(runs.count(), 2);
}

#[tokio::test(start_paused = true)]
async fn lease_and_retention_are_separate_clocks() {
    let idem = idem().with_retention(Duration::from_secs(3600));
    let fingerprint = Fingerprint::of_bytes(b"x");
    let Begin::Run(_crashed) = idem.begin("k", fingerprint).await.unwrap() else {
        panic!("fresh key must be claimed");
    };
    let record = idem
        .store()
        .load(idem.key("k").unwrap().as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.lease_remaining, Some(LEASE));
    assert_eq!(record.retention_remaining, Duration::from_secs(3600));
    // A crashed owner blocks the key for the lease, not the retention.
    tokio::time::advance(LEASE).await;
    assert!(matches!(
        idem.begin("k", fingerprint).await.unwrap(),
        Begin::Run(_)
    ));
}
