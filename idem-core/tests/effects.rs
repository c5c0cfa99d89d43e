//! Derived keys across retries and takeovers, and the pieces a store uses
//! to record an outcome inside its own transaction.

use std::time::Duration;

use idem_core::store::State;
use idem_core::{BeginJson, Error, Fingerprint, Idempotent, Key, MemoryStore};

const LEASE: Duration = Duration::from_secs(10);

fn idem() -> Idempotent {
    Idempotent::new(MemoryStore::new()).with_lease(LEASE)
}

async fn lease(idem: &Idempotent, key: &str) -> idem_core::Lease {
    match idem.begin_json::<_, u32, ()>(key, "body").await {
        Ok(BeginJson::Run(lease)) => lease,
        other => panic!("expected to run, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_taker_over_derives_the_same_key_as_the_crashed_owner() {
    let idem = idem();
    let first = lease(&idem, "order-7f3a").await;
    let sent = first.derive_key("gateway");
    // The first owner crashes; its lease lapses and a retry takes over.
    tokio::time::advance(LEASE + Duration::from_millis(1)).await;
    let second = lease(&idem, "order-7f3a").await;
    assert_ne!(first.token(), second.token());
    assert_eq!(second.derive_key("gateway"), sent);
    assert_ne!(second.derive_key("email"), sent);
    assert_eq!(sent, Key::derive(&[first.key().as_str(), "gateway"]));
}

#[tokio::test]
async fn derived_keys_differ_by_scope_and_namespace() {
    let idem = idem();
    let plain = lease(&idem, "k").await.derive_key("s");
    let scoped = lease(&idem.scoped("tenant-a"), "k").await.derive_key("s");
    let named = lease(&idem.clone().with_namespace("app"), "k")
        .await
        .derive_key("s");
    assert_ne!(plain, scoped);
    assert_ne!(plain, named);
    assert_ne!(scoped, named);
    for key in [plain, scoped, named] {
        assert!(idem_core::Key::validate_client_key(&key).is_ok(), "{key}");
    }
}

#[tokio::test]
async fn begin_json_replays_what_execute_recorded_and_refuses_what_execute_refuses() {
    let idem = idem();
    let n: u32 = idem
        .execute("k", "body", || async { Ok::<_, ()>(7) })
        .await
        .unwrap();
    match idem.begin_json::<_, u32, ()>("k", "body").await {
        Ok(BeginJson::Replayed(replayed)) => assert_eq!(replayed, n),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert!(matches!(
        idem.begin_json::<_, u32, ()>("k", "another body").await,
        Err(Error::Mismatch)
    ));
    assert!(matches!(
        idem.begin_json::<_, u32, ()>("bad key", "body").await,
        Err(Error::InvalidKey(_))
    ));
    let remembered: Result<u32, Error<String>> = idem
        .execute_remembering(
            "declined",
            "body",
            |_| true,
            || async { Err("card declined".to_owned()) },
        )
        .await;
    assert!(matches!(remembered, Err(Error::Work(_))));
    assert!(matches!(
        idem.begin_json::<_, u32, ()>("declined", "body").await,
        Err(Error::Remembered(serde_json::Value::String(s))) if s == "card declined"
    ));
}

#[tokio::test]
async fn the_record_a_lease_settles_with_carries_its_token_fingerprint_and_retention() {
    let idem = idem().with_retention(Duration::from_secs(3600));
    let lease = lease(&idem, "k").await;
    let done = lease.record(State::Completed, b"7");
    assert_eq!(done.token, lease.token());
    assert_eq!(done.fingerprint, Fingerprint::of_json("body").unwrap());
    assert_eq!(done.lease, None);
    assert_eq!(done.retention, Duration::from_secs(3600));
    assert_eq!(lease.record(State::InFlight, b"").lease, Some(LEASE));
    // Writing it through the store's fenced swap is what `complete` does.
    assert!(idem
        .store()
        .swap(lease.key().as_str(), lease.token(), &done)
        .await
        .unwrap());
    let stored = idem
        .store()
        .load(lease.key().as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (stored.state, stored.payload),
        (State::Completed, b"7".to_vec())
    );
}

#[tokio::test(start_paused = true)]
async fn run_says_when_the_lease_was_taken_over_under_the_work() {
    let idem = idem();
    let owner = lease(&idem, "k").await;
    let kept = owner
        .run(async { tokio::time::sleep(LEASE * 3).await })
        .await;
    assert!(
        !kept.lease_lost,
        "the heartbeat keeps a running owner's lease"
    );
    let stolen = owner
        .run(async {
            // Another caller steals the key: its token replaces ours.
            let key = owner.key().as_str();
            let rival = idem_core::store::NewRecord {
                token: idem_core::store::Token::random(),
                ..owner.record(State::InFlight, b"")
            };
            assert!(idem.store().swap(key, owner.token(), &rival).await.unwrap());
            tokio::time::sleep(LEASE).await;
        })
        .await;
    assert!(stolen.lease_lost);
}
