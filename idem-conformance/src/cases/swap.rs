//! Owner transitions: `swap` (complete, fail, renew) and `remove`
//! (release) change a record only for its owner, and only while InFlight.

use std::time::Duration;

use idem_core::store::{State, Store, Token};
use tokio::time::Instant;

use crate::support::{
    absent, claim, final_record, fp, in_flight, key, live, ok, pass, settled, short_lived, LONG,
    RETENTION,
};
use crate::Factory;

/// `swap` with the owner's token replaces an InFlight record.
pub async fn swap_with_the_owner_token_replaces_the_record(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    for (name, state) in [
        ("swap-complete", State::Completed),
        ("swap-fail", State::Failed),
    ] {
        let key = key(name);
        let token = Token::random();
        claim(&*store, &key, &in_flight(token, fp(1), LONG)).await;
        let done = settled(token, fp(1), state, b"outcome", RETENTION);
        assert!(
            ok(store.swap(&key, token, &done).await, "swap"),
            "the owner's swap to {state:?} was refused"
        );
        let record = live(&*store, &key).await;
        assert_eq!(record.state, state);
        assert_eq!(record.payload, b"outcome");
        assert_eq!(record.token, token);
        assert_eq!(
            record.lease_remaining, None,
            "a {state:?} record has no lease"
        );
    }
}

/// `swap` with a wrong token returns false and changes nothing.
pub async fn swap_with_a_wrong_token_changes_nothing(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("swap-wrong-token");
    let owner = Token::random();
    claim(&*store, &key, &in_flight(owner, fp(1), LONG)).await;

    let intruder = Token::random();
    let forged = settled(intruder, fp(1), State::Completed, b"forged", RETENTION);
    assert!(
        !ok(store.swap(&key, intruder, &forged).await, "swap"),
        "swap with a wrong token reported success"
    );
    let record = live(&*store, &key).await;
    assert_eq!(
        record.token, owner,
        "swap with a wrong token replaced the record"
    );
    assert_eq!(
        record.state,
        State::InFlight,
        "swap with a wrong token changed the state"
    );
    assert!(
        record.payload.is_empty(),
        "swap with a wrong token wrote its payload"
    );
}

/// `swap` on a Completed or Failed record is refused, even with its token.
pub async fn swap_on_a_completed_or_failed_record_changes_nothing(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    for (name, state) in [
        ("swap-final-completed", State::Completed),
        ("swap-final-failed", State::Failed),
    ] {
        let key = key(name);
        let token = Token::random();
        claim(&*store, &key, &in_flight(token, fp(1), LONG)).await;
        let first = settled(token, fp(1), state, b"first", RETENTION);
        assert!(ok(store.swap(&key, token, &first).await, "swap"));

        let again = settled(token, fp(1), State::Completed, b"second", RETENTION);
        assert!(
            !ok(store.swap(&key, token, &again).await, "swap"),
            "a {state:?} record was swapped again: it must be final"
        );
        let renew = in_flight(token, fp(1), LONG);
        assert!(
            !ok(store.swap(&key, token, &renew).await, "swap"),
            "a {state:?} record went back to InFlight"
        );
        let record = live(&*store, &key).await;
        assert_eq!(record.state, state, "a final record changed state");
        assert_eq!(
            record.payload, b"first",
            "a final record's outcome was overwritten"
        );
    }
}

/// `swap` on an absent key returns false and creates nothing.
pub async fn swap_on_an_absent_key_creates_nothing(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("swap-absent");
    let token = Token::random();
    let record = settled(token, fp(1), State::Completed, b"ghost", RETENTION);
    assert!(
        !ok(store.swap(&key, token, &record).await, "swap"),
        "swap on an absent key reported success"
    );
    absent(&*store, &key, "after a swap on an absent key").await;
}

/// A renewing `swap` computes the new lease from now, not from the claim.
pub async fn swap_renews_the_lease_from_now(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("swap-renew");
    let lease = Duration::from_millis(400);
    let token = Token::random();
    claim(&*store, &key, &in_flight(token, fp(1), lease)).await;
    tokio::time::sleep(Duration::from_millis(250)).await;

    let renewed_at = Instant::now();
    assert!(
        ok(
            store
                .swap(&key, token, &in_flight(token, fp(1), lease))
                .await,
            "swap"
        ),
        "renewal refused"
    );
    let record = live(&*store, &key).await;
    let since = renewed_at.elapsed();
    let left = record
        .lease_remaining
        .unwrap_or_else(|| panic!("a renewed claim has no lease: {record:?}"));
    assert!(
        left <= lease,
        "the renewed lease reports {left:?} left, more than the {lease:?} asked for"
    );
    assert!(
        left + since + Duration::from_millis(5) >= lease,
        "the renewed lease reports {left:?} left {since:?} after renewal: it was not computed from now"
    );
}

/// A renewal (a `swap` that keeps the record InFlight) restarts *both*
/// deadlines from now: the lease and the retention. A renewal that kept the
/// claim's retention would let heartbeating work outlive its record, and
/// the key would be claimed again while the work still runs.
pub async fn renewal_restarts_retention_from_now(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let (lease, claim_retention) = (Duration::from_millis(100), Duration::from_millis(300));
    // The renewal must come before the claim's retention lapses; a machine
    // too slow for that makes the round inconclusive.
    for round in 0..4 {
        let key = key(&format!("renew-retention-{round}"));
        let token = Token::random();
        let claiming = Instant::now();
        claim(&*store, &key, &short_lived(token, lease, claim_retention)).await;
        tokio::time::sleep(lease).await;

        let renewing = Instant::now();
        let renewal = in_flight(token, fp(0), LONG);
        let renewed = ok(store.swap(&key, token, &renewal).await, "swap");
        if !renewed && claiming.elapsed() >= claim_retention {
            continue;
        }
        assert!(renewed, "the owner's renewal was refused");
        let record = live(&*store, &key).await;
        let spent = renewing.elapsed() + Duration::from_millis(10);
        assert!(
            record.retention_remaining + spent >= renewal.retention,
            "a renewal asking for {:?} of retention left {:?}: it kept the claim's retention deadline",
            renewal.retention,
            record.retention_remaining
        );
        assert!(
            record
                .lease_remaining
                .is_some_and(|left| left + spent >= LONG),
            "a renewal asking for a {LONG:?} lease left {:?}",
            record.lease_remaining
        );

        pass(claiming, claim_retention).await;
        match ok(store.load(&key).await, "load") {
            Some(record) => assert_eq!(record.token, token),
            None => panic!(
                "a renewed record expired with the claim's {claim_retention:?} retention: the renewal did not restart it"
            ),
        }
        return;
    }
    panic!(
        "the machine was too slow to renew within a {claim_retention:?} retention in every round"
    );
}

/// An owner whose lease lapsed but was not taken over can still complete.
pub async fn swap_by_a_late_owner_succeeds_when_nobody_took_over(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("swap-late-owner");
    let token = Token::random();
    let lease = Duration::from_millis(100);
    claim(&*store, &key, &in_flight(token, fp(1), lease)).await;
    pass(Instant::now(), lease).await;

    let done = settled(token, fp(1), State::Completed, b"late", RETENTION);
    assert!(
        ok(store.swap(&key, token, &done).await, "swap"),
        "a live InFlight record with the right token refused swap after its lease lapsed"
    );
    assert_eq!(live(&*store, &key).await.payload, b"late");
}

/// `remove` with the owner's token deletes an InFlight record.
pub async fn remove_with_the_owner_token_deletes_the_record(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("remove-owner");
    let token = Token::random();
    claim(&*store, &key, &in_flight(token, fp(1), LONG)).await;
    assert!(
        ok(store.remove(&key, token).await, "remove"),
        "the owner's remove was refused"
    );
    absent(&*store, &key, "after its owner removed it").await;
    claim(&*store, &key, &in_flight(Token::random(), fp(1), LONG)).await;
}

/// `remove` with a wrong token returns false and deletes nothing.
pub async fn remove_with_a_wrong_token_changes_nothing(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("remove-wrong-token");
    let owner = Token::random();
    claim(&*store, &key, &in_flight(owner, fp(1), LONG)).await;
    assert!(
        !ok(store.remove(&key, Token::random()).await, "remove"),
        "remove with a wrong token reported success"
    );
    assert_eq!(
        live(&*store, &key).await.token,
        owner,
        "remove with a wrong token changed the record"
    );
}

/// `remove` on a Completed record is refused, even with its token.
pub async fn remove_on_a_completed_record_changes_nothing(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    remove_on_a_final_record_changes_nothing(&*fixture.store(), State::Completed).await;
}

/// `remove` on a Failed record is refused, even with its token: a
/// remembered failure is final.
pub async fn remove_on_a_failed_record_changes_nothing(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    remove_on_a_final_record_changes_nothing(&*fixture.store(), State::Failed).await;
}

async fn remove_on_a_final_record_changes_nothing(store: &dyn Store, state: State) {
    let key = key(&format!("remove-{state:?}"));
    let token = final_record(store, &key, state, b"kept").await;
    assert!(
        !ok(store.remove(&key, token).await, "remove"),
        "a {state:?} record was removed"
    );
    let record = live(store, &key).await;
    assert_eq!(
        (record.state, record.payload.as_slice()),
        (state, &b"kept"[..]),
        "a {state:?} record was lost"
    );
}

/// `remove` on an absent key returns false.
pub async fn remove_on_an_absent_key_returns_false(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    assert!(
        !ok(
            store.remove(&key("remove-absent"), Token::random()).await,
            "remove"
        ),
        "remove of an absent key reported success"
    );
}
