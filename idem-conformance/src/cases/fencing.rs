//! Recovery and fencing: `take_over` wins a key only from a lapsed lease,
//! and a superseded token changes nothing.

use std::time::Duration;

use idem_core::store::{State, Store, Token};
use tokio::time::Instant;

use crate::support::{
    claim, final_record, fp, in_flight, key, live, ok, pass, settled, until_lease_lapsed, LONG,
    PATIENCE, POLL, RETENTION,
};
use crate::Factory;

/// `take_over` fails while the owner's lease is live.
pub async fn take_over_fails_while_the_lease_is_live(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("take-over-live");
    let owner = Token::random();
    claim(&*store, &key, &in_flight(owner, fp(1), LONG)).await;
    let thief = Token::random();
    assert!(
        !ok(
            store
                .take_over(&key, owner, &in_flight(thief, fp(1), LONG))
                .await,
            "take_over"
        ),
        "take_over won a key whose lease is live"
    );
    assert_eq!(
        live(&*store, &key).await.token,
        owner,
        "a refused take_over changed the record"
    );
}

/// `take_over` succeeds once the lease lapsed and installs the new owner.
pub async fn take_over_succeeds_once_the_lease_lapsed(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("take-over-lapsed");
    let owner = Token::random();
    claim(
        &*store,
        &key,
        &in_flight(owner, fp(1), Duration::from_millis(100)),
    )
    .await;

    let heir = Token::random();
    let give_up = Instant::now() + PATIENCE;
    while !ok(
        store
            .take_over(&key, owner, &in_flight(heir, fp(1), LONG))
            .await,
        "take_over",
    ) {
        assert!(
            Instant::now() < give_up,
            "take_over never succeeded on a 100 ms lease after {PATIENCE:?}: leases must lapse"
        );
        tokio::time::sleep(POLL).await;
    }
    let record = live(&*store, &key).await;
    assert_eq!(
        record.token, heir,
        "take_over reported success but kept the old token"
    );
    assert_eq!(record.state, State::InFlight);
    assert!(
        record.lease_remaining.is_some_and(|left| left > LONG / 2),
        "the new owner's lease was not set from now: {:?}",
        record.lease_remaining
    );
}

/// `take_over` fails once the owner renewed, though the first lease lapsed.
pub async fn take_over_fails_after_the_owner_renewed(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let lease = Duration::from_millis(600);
    // A machine too slow to act within the renewed lease makes a round
    // inconclusive; one of a few rounds decides.
    for round in 0..4 {
        let key = key(&format!("take-over-renewed-{round}"));
        let owner = Token::random();
        claim(&*store, &key, &in_flight(owner, fp(1), lease)).await;
        let claimed = Instant::now();
        tokio::time::sleep(lease / 2).await;
        let renewed = Instant::now();
        assert!(ok(
            store
                .swap(&key, owner, &in_flight(owner, fp(1), lease))
                .await,
            "swap"
        ));
        pass(claimed, lease).await;

        let taken = ok(
            store
                .take_over(&key, owner, &in_flight(Token::random(), fp(1), LONG))
                .await,
            "take_over",
        );
        if renewed.elapsed() >= lease {
            continue;
        }
        assert!(
            !taken,
            "take_over won a key whose owner renewed its lease: the renewal was ignored"
        );
        assert_eq!(live(&*store, &key).await.token, owner);
        return;
    }
    panic!("the machine was too slow to act within a {lease:?} lease in every round");
}

/// `take_over` with a token other than the owner's fails, even once the
/// lease lapsed.
pub async fn take_over_with_a_wrong_token_fails(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("take-over-wrong-token");
    let owner = Token::random();
    claim(
        &*store,
        &key,
        &in_flight(owner, fp(1), Duration::from_millis(50)),
    )
    .await;
    until_lease_lapsed(&*store, &key).await;

    assert!(
        !ok(
            store
                .take_over(
                    &key,
                    Token::random(),
                    &in_flight(Token::random(), fp(1), LONG)
                )
                .await,
            "take_over"
        ),
        "take_over with a wrong token won the key"
    );
    assert_eq!(
        live(&*store, &key).await.token,
        owner,
        "a refused take_over changed the record"
    );
}

/// `take_over` of a Completed record fails: it is final.
pub async fn take_over_of_a_completed_record_fails(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    take_over_of_a_final_record_fails(&*fixture.store(), State::Completed).await;
}

/// `take_over` of a Failed record fails, though a Failed record has no
/// lease: a failure remembered a moment ago is final, and taking it over
/// would run its work again.
pub async fn take_over_of_a_failed_record_fails(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    take_over_of_a_final_record_fails(&*fixture.store(), State::Failed).await;
}

async fn take_over_of_a_final_record_fails(store: &dyn Store, state: State) {
    let key = key(&format!("take-over-{state:?}"));
    let owner = final_record(store, &key, state, b"final").await;

    assert!(
        !ok(
            store
                .take_over(&key, owner, &in_flight(Token::random(), fp(1), LONG))
                .await,
            "take_over"
        ),
        "take_over replaced a {state:?} record"
    );
    let record = live(store, &key).await;
    assert_eq!(record.state, state, "take_over changed a {state:?} record");
    assert_eq!(record.payload, b"final");
}

/// After a take_over the old token can neither swap, remove nor take over.
pub async fn stale_token_changes_nothing_after_a_take_over(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("stale-token");
    let stale = Token::random();
    claim(
        &*store,
        &key,
        &in_flight(stale, fp(1), Duration::from_millis(50)),
    )
    .await;
    until_lease_lapsed(&*store, &key).await;
    let heir = Token::random();
    assert!(ok(
        store
            .take_over(
                &key,
                stale,
                &in_flight(heir, fp(1), Duration::from_millis(50))
            )
            .await,
        "take_over"
    ));
    // The heir's own lease lapses too, so only the token can refuse the
    // stale owner below.
    pass(Instant::now(), Duration::from_millis(50)).await;

    let late = settled(stale, fp(1), State::Completed, b"stale", RETENTION);
    assert!(
        !ok(store.swap(&key, stale, &late).await, "swap"),
        "a stale token completed the key"
    );
    assert!(
        !ok(
            store
                .swap(&key, stale, &in_flight(stale, fp(1), LONG))
                .await,
            "swap"
        ),
        "a stale token renewed"
    );
    assert!(
        !ok(store.remove(&key, stale).await, "remove"),
        "a stale token removed the key"
    );
    assert!(
        !ok(
            store
                .take_over(&key, stale, &in_flight(Token::random(), fp(1), LONG))
                .await,
            "take_over"
        ),
        "a stale token was accepted by take_over"
    );
    let record = live(&*store, &key).await;
    assert_eq!(record.token, heir, "a stale token changed the record");
    assert_eq!(record.state, State::InFlight);
    assert!(record.payload.is_empty());
}
