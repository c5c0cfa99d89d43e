//! `reset`, an operator's step: it deletes a settled record and nothing
//! else, in one atomic step, and never lets a token the record held back
//! in.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Insert, Reset, State, Store, Token};
use tokio::time::Instant;

use crate::support::{
    absent, claim, final_record, fp, in_flight, key, live, ok, pass, race, settled, Call, Start,
    LONG, RETENTION,
};
use crate::Factory;

/// Resets `key`, naming the call on failure.
async fn reset(store: &dyn Store, key: &str) -> Reset {
    ok(store.reset(key).await, "reset")
}

/// Checks that a settled record in `state` is deleted by a reset, that the
/// key can be claimed again, and that another key is left as it was.
async fn deletes(factory: &dyn Factory, state: State) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key(&format!("reset-{state:?}"));
    let neighbour = key.clone() + "-neighbour";
    final_record(&*store, &key, state, b"outcome").await;
    let kept = final_record(&*store, &neighbour, state, b"kept").await;

    assert_eq!(
        reset(&*store, &key).await,
        Reset::Deleted(state),
        "a reset of a live {state:?} record must delete it and say so"
    );
    absent(
        &*store,
        &key,
        &format!("after a reset deleted the {state:?} record"),
    )
    .await;
    assert_eq!(
        reset(&*store, &key).await,
        Reset::Absent,
        "a second reset found something where the first deleted the record"
    );
    let next = Token::random();
    assert_eq!(
        ok(
            store.insert(&key, &in_flight(next, fp(2), LONG)).await,
            "insert"
        ),
        Insert::Inserted,
        "a reset key must be claimed again, by any request"
    );
    let other = live(&*store, &neighbour).await;
    assert_eq!(
        (other.token, other.state, other.payload.as_slice()),
        (kept, state, &b"kept"[..]),
        "a reset of one key changed another"
    );
}

/// `reset` deletes a live Completed record and answers `Deleted(Completed)`.
pub async fn reset_deletes_a_completed_record(factory: &dyn Factory) {
    deletes(factory, State::Completed).await;
}

/// `reset` deletes a live Failed record and answers `Deleted(Failed)`.
pub async fn reset_deletes_a_failed_record(factory: &dyn Factory) {
    deletes(factory, State::Failed).await;
}

/// `reset` refuses an InFlight record, live or with its lease lapsed, and
/// leaves it exactly as it was.
pub async fn reset_refuses_an_in_flight_record(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let lease = Duration::from_millis(50);
    let held = key("reset-in-flight-held");
    let lapsed = key("reset-in-flight-lapsed");
    let (holder, crashed) = (Token::random(), Token::random());
    claim(&*store, &held, &in_flight(holder, fp(1), LONG)).await;
    claim(&*store, &lapsed, &in_flight(crashed, fp(1), lease)).await;
    pass(Instant::now(), lease).await;

    for (key, owner, what) in [
        (&held, holder, "with a live lease"),
        (&lapsed, crashed, "with a lapsed lease"),
    ] {
        assert_eq!(
            reset(&*store, key).await,
            Reset::InFlight,
            "a reset of a record in flight {what} must be refused"
        );
        let record = live(&*store, key).await;
        assert_eq!(
            (record.state, record.token),
            (State::InFlight, owner),
            "a refused reset changed a record in flight {what}"
        );
    }
    // The refused record is still its owner's: the owner settles it, and a
    // recoverer takes the lapsed one over.
    let done = settled(holder, fp(1), State::Completed, b"done", RETENTION);
    assert!(
        ok(store.swap(&held, holder, &done).await, "swap"),
        "after a refused reset the owner could not complete"
    );
    assert!(
        ok(
            store
                .take_over(&lapsed, crashed, &in_flight(Token::random(), fp(1), LONG))
                .await,
            "take_over"
        ),
        "after a refused reset a lapsed lease could not be taken over"
    );
}

/// `reset` of a key never used, or whose record is past retention, answers
/// `Absent` and deletes nothing.
pub async fn reset_of_an_absent_or_expired_key_changes_nothing(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    assert_eq!(
        reset(&*store, &key("reset-never-used")).await,
        Reset::Absent,
        "a reset of a key never used must answer Absent"
    );

    let brief = Duration::from_millis(200);
    let expired = key("reset-expired");
    let owner = Token::random();
    claim(&*store, &expired, &in_flight(owner, fp(1), LONG)).await;
    let done = settled(owner, fp(1), State::Completed, b"old", brief);
    assert!(ok(store.swap(&expired, owner, &done).await, "swap"));
    pass(Instant::now(), brief).await;
    assert_eq!(
        reset(&*store, &expired).await,
        Reset::Absent,
        "a record past retention is absent: a reset must not report deleting it"
    );
    assert_eq!(
        ok(
            store
                .insert(&expired, &in_flight(Token::random(), fp(1), LONG))
                .await,
            "insert"
        ),
        Insert::Inserted,
        "after a reset of an expired record the key must be free"
    );
}

/// What one racer of [`reset_racing_replays_and_claims_has_one_winner`]
/// got.
#[derive(Debug)]
enum Raced {
    Reset(Reset),
    Claim(Token, Insert),
}

/// Two resets of a Completed record race eight claims of its key (the
/// retries of a client): exactly one reset deletes it, at most one claim
/// wins, every other claim is shown the original record (a replay) or the
/// winner's, and no reset deletes the winner's claim. Counted over four
/// rounds, two in turn and two spawned.
pub async fn reset_racing_replays_and_claims_has_one_winner(factory: &dyn Factory) {
    const RESETS: usize = 2;
    const CLAIMS: usize = 8;
    let fixture = factory.fixture().await;
    let store = fixture.store();
    for round in 0..4 {
        let start = Start::BOTH[round % 2];
        let key = Arc::new(key(&format!("reset-race-{round}")));
        let original = final_record(&*store, &key, State::Completed, b"first").await;

        // In turn, each reset is followed by claims that start at once
        // and claims that start one turn later: a reset that checks,
        // awaits and deletes has a claim land between its check and its
        // delete, on every run.
        let mut racers: Vec<Call<'static, Raced>> = Vec::new();
        for _ in 0..RESETS {
            let (resetter, reset_key) = (Arc::clone(&store), Arc::clone(&key));
            racers.push(Box::pin(async move {
                Raced::Reset(ok(resetter.reset(&reset_key).await, "reset"))
            }));
            for n in 0..CLAIMS / RESETS {
                let (store, key) = (Arc::clone(&store), Arc::clone(&key));
                let token = Token::random();
                racers.push(Box::pin(async move {
                    for _ in 0..n % 2 {
                        tokio::task::yield_now().await;
                    }
                    let found = store.insert(&key, &in_flight(token, fp(1), LONG)).await;
                    Raced::Claim(token, ok(found, "insert"))
                }));
            }
        }
        let outcomes = race(start, racers).await;

        let deleted = outcomes
            .iter()
            .filter(|o| matches!(o, Raced::Reset(Reset::Deleted(_))))
            .count();
        assert_eq!(
            deleted, 1,
            "{RESETS} resets of one Completed record ({start:?}) deleted it {deleted} times: {outcomes:?}"
        );
        let winners: Vec<Token> = outcomes
            .iter()
            .filter_map(|o| match o {
                Raced::Claim(token, Insert::Inserted) => Some(*token),
                _ => None,
            })
            .collect();
        assert!(
            winners.len() <= 1,
            "{CLAIMS} claims racing resets ({start:?}) had {} winners: {outcomes:?}",
            winners.len()
        );
        for outcome in &outcomes {
            match outcome {
                Raced::Claim(_, Insert::Found(found)) => assert!(
                    (found.token == original && found.state == State::Completed)
                        || (winners.contains(&found.token) && found.state == State::InFlight),
                    "a claim ({start:?}) was shown a record that is neither the original nor the winner's: {found:?}"
                ),
                Raced::Reset(Reset::InFlight) => assert!(
                    !winners.is_empty(),
                    "a reset ({start:?}) found a record in flight though no claim won"
                ),
                _ => {}
            }
        }
        let stored = ok(store.load(&key).await, "load").map(|r| (r.state, r.token));
        match winners.first() {
            Some(&winner) => assert_eq!(
                stored,
                Some((State::InFlight, winner)),
                "the claim that won ({start:?}) is not stored: a reset deleted it"
            ),
            None => {
                assert_eq!(stored, None, "the reset won but the record is still there");
                // Nobody claimed after the delete: the next claim is the
                // one new first execution.
                let next = ok(
                    store
                        .insert(&key, &in_flight(Token::random(), fp(1), LONG))
                        .await,
                    "insert",
                );
                assert_eq!(
                    next,
                    Insert::Inserted,
                    "after the reset the key stayed held"
                );
            }
        }
    }
}

/// A reset deletes rather than rewrites: after it, neither the owner whose
/// lease was taken over nor the owner that completed changes anything with
/// its token, before or after the next claim.
pub async fn reset_never_lets_a_stale_owner_complete(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let key = key("reset-fencing");
    let lease = Duration::from_millis(50);
    let first = Token::random();
    claim(&*store, &key, &in_flight(first, fp(1), lease)).await;
    pass(Instant::now(), lease).await;
    let heir = Token::random();
    assert!(ok(
        store
            .take_over(&key, first, &in_flight(heir, fp(1), LONG))
            .await,
        "take_over"
    ));
    let done = settled(heir, fp(1), State::Completed, b"heir", RETENTION);
    assert!(ok(store.swap(&key, heir, &done).await, "swap"));
    assert_eq!(reset(&*store, &key).await, Reset::Deleted(State::Completed));

    let stale = |when: &'static str| {
        let (store, key) = (Arc::clone(&store), key.clone());
        async move {
            for (token, who) in [
                (first, "the owner taken over"),
                (heir, "the owner that completed"),
            ] {
                let late = settled(token, fp(1), State::Completed, b"late", RETENTION);
                assert!(
                    !ok(store.swap(&key, token, &late).await, "swap"),
                    "{who}'s late completion landed {when}"
                );
                let renewal = in_flight(token, fp(1), LONG);
                assert!(
                    !ok(store.swap(&key, token, &renewal).await, "swap"),
                    "{who}'s late renewal landed {when}"
                );
                let taker = in_flight(Token::random(), fp(1), LONG);
                assert!(
                    !ok(store.take_over(&key, token, &taker).await, "take_over"),
                    "a takeover from {who}'s token won {when}"
                );
                assert!(
                    !ok(store.remove(&key, token).await, "remove"),
                    "{who}'s release took effect {when}"
                );
            }
        }
    };
    stale("after the reset").await;
    absent(&*store, &key, "after a reset and only stale owners' calls").await;

    let next = Token::random();
    claim(&*store, &key, &in_flight(next, fp(2), LONG)).await;
    stale("after the reset and a new claim").await;
    let record = live(&*store, &key).await;
    assert_eq!(
        (record.state, record.token),
        (State::InFlight, next),
        "a stale owner changed the claim made after the reset"
    );
}
