//! Atomicity under races: callers racing on one key see the outcome of some
//! serial order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Insert, State, Token};
use idem_core::Error;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::support::{
    claim, fp, idempotent, in_flight, join_all, key, live, ok, pass, race, settled, Call, Start,
    LONG, RETENTION,
};
use crate::Factory;

const RACERS: usize = 32;

/// 32 concurrent inserts of one absent key yield exactly one `Inserted`,
/// and every loser is shown the winner's record.
pub async fn concurrent_inserts_of_one_key_yield_exactly_one_inserted(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    // Two rounds each way: in turn, which meets an insert that checks,
    // awaits and writes on every run, and spawned across threads.
    for round in 0..4 {
        let start = Start::BOTH[round % 2];
        let key = Arc::new(key(&format!("race-insert-{round}")));
        let racers = (0..RACERS)
            .map(|_| {
                let (store, key) = (Arc::clone(&store), Arc::clone(&key));
                let token = Token::random();
                Box::pin(async move {
                    let inserted = store.insert(&key, &in_flight(token, fp(1), LONG)).await;
                    (token, ok(inserted, "insert"))
                }) as Call<'static, _>
            })
            .collect();
        let outcomes = race(start, racers).await;
        let winners: Vec<Token> = outcomes
            .iter()
            .filter(|(_, outcome)| *outcome == Insert::Inserted)
            .map(|(token, _)| *token)
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "{RACERS} concurrent inserts of one key ({start:?}) returned Inserted {} times",
            winners.len()
        );
        for (_, outcome) in &outcomes {
            if let Insert::Found(record) = outcome {
                assert_eq!(
                    record.token, winners[0],
                    "a loser was shown a record other than the winner's"
                );
            }
        }
        assert_eq!(
            live(&*store, &key).await.token,
            winners[0],
            "the stored record is not the winner's"
        );
    }
}

/// Concurrent takeovers of one lapsed lease have exactly one winner.
pub async fn racing_take_overs_have_exactly_one_winner(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let lease = Duration::from_millis(50);
    let keys = Start::BOTH.map(|start| key(&format!("race-take-over-{start:?}")));
    let owners = Start::BOTH.map(|_| Token::random());
    for (key, owner) in keys.iter().zip(owners) {
        claim(&*store, key, &in_flight(owner, fp(1), lease)).await;
    }
    pass(tokio::time::Instant::now(), lease).await;

    for ((start, key), owner) in Start::BOTH.into_iter().zip(keys).zip(owners) {
        let key = Arc::new(key);
        let racers = (0..RACERS)
            .map(|_| {
                let (store, key) = (Arc::clone(&store), Arc::clone(&key));
                let heir = Token::random();
                Box::pin(async move {
                    let won = store
                        .take_over(&key, owner, &in_flight(heir, fp(1), LONG))
                        .await;
                    (heir, ok(won, "take_over"))
                }) as Call<'static, _>
            })
            .collect();
        let winners: Vec<Token> = race(start, racers)
            .await
            .into_iter()
            .filter_map(|(heir, won): (Token, bool)| won.then_some(heir))
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "{RACERS} racing takeovers ({start:?}) had {} winners",
            winners.len()
        );
        assert_eq!(
            live(&*store, &key).await.token,
            winners[0],
            "the stored record is not the winner's"
        );
    }
}

/// A late owner completing and a recoverer taking over race with exactly
/// one winner, and the record is the winner's.
pub async fn late_owner_and_recoverer_race_with_exactly_one_winner(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    for start in Start::BOTH {
        owner_and_recoverer_race(&fixture, Move::Complete, start).await;
    }
}

/// A late owner releasing its key and a recoverer taking it over race with
/// exactly one winner: a release never deletes the heir's record.
pub async fn release_and_take_over_race_with_exactly_one_winner(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    for start in Start::BOTH {
        owner_and_recoverer_race(&fixture, Move::Release, start).await;
    }
}

/// What the late owner does while a recoverer takes its key over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    Complete,
    Release,
}

async fn owner_and_recoverer_race(fixture: &crate::Fixture, owner_move: Move, start: Start) {
    let store = fixture.store();
    const KEYS: usize = 48;
    let lease = Duration::from_millis(50);
    let name = |n: usize| key(&format!("late-owner-{owner_move:?}-{start:?}-{n}"));
    let mut owners = Vec::new();
    for n in 0..KEYS {
        let owner = Token::random();
        claim(&*store, &name(n), &in_flight(owner, fp(1), lease)).await;
        owners.push(owner);
    }
    pass(tokio::time::Instant::now(), lease).await;

    let mut racers = Vec::new();
    for (n, owner) in owners.into_iter().enumerate() {
        let heir = Token::random();
        // In turn, half the keys poll the owner first and half the heir
        // first, so whichever of the two checks, awaits and then writes
        // has the other's whole call land in between on some key.
        let order = if n % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for recover in order {
            let (store, key) = (Arc::clone(&store), name(n));
            // Spawned, each key's two racers start a different number of
            // scheduler turns after the barrier (all nine pairs of 0, 1
            // and 2 turns occur), so the tasks meet on several threads in
            // many orders.
            let turns = match start {
                Start::InTurn => 0,
                Start::Spawned if recover => (n / 3) % 3,
                Start::Spawned => n % 3,
            };
            racers.push(Box::pin(async move {
                for _ in 0..turns {
                    tokio::task::yield_now().await;
                }
                let won = if recover {
                    ok(
                        store
                            .take_over(&key, owner, &in_flight(heir, fp(1), LONG))
                            .await,
                        "take_over",
                    )
                } else if owner_move == Move::Release {
                    ok(store.remove(&key, owner).await, "remove")
                } else {
                    let done = settled(owner, fp(1), State::Completed, b"late", RETENTION);
                    ok(store.swap(&key, owner, &done).await, "swap")
                };
                (n, recover, won, heir)
            }) as Call<'static, _>);
        }
    }
    let outcomes: Vec<(usize, bool, bool, Token)> = race(start, racers).await;
    for n in 0..KEYS {
        let won: Vec<_> = outcomes.iter().filter(|o| o.0 == n && o.2).collect();
        assert_eq!(
            won.len(),
            1,
            "a late owner's {owner_move:?} and a takeover of one key ({start:?}) had {} winners",
            won.len()
        );
        let record = ok(store.load(&name(n)).await, "load");
        let stored = record.as_ref().map(|r| (r.state, r.token));
        if won[0].1 {
            assert_eq!(
                stored,
                Some((State::InFlight, won[0].3)),
                "the takeover won but its record is not stored"
            );
        } else if owner_move == Move::Release {
            assert_eq!(stored, None, "the release won but the key is still held");
        } else {
            assert_eq!(
                stored.map(|(state, _)| state),
                Some(State::Completed),
                "the completion won but its record is not stored"
            );
        }
    }
}

/// 32 concurrent executes of one key run the work once; the rest are told
/// it is in progress or get its outcome.
pub async fn concurrent_executes_run_the_work_once(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    // A lease no racer can outlive: this case is about the claim, not
    // about lapses.
    let idem = idempotent(fixture.store()).with_lease(LONG);
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = JoinSet::new();
    for _ in 0..RACERS {
        let (idem, runs, barrier) = (idem.clone(), Arc::clone(&runs), Arc::clone(&barrier));
        tasks.spawn(async move {
            barrier.wait().await;
            idem.execute("race-execute", &"body", || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, String>(42u32)
            })
            .await
        });
    }
    for outcome in join_all(tasks).await {
        match outcome {
            Ok(42) | Err(Error::InProgress { .. }) => {}
            other => panic!("a racing execute got {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran more than once for one key"
    );
    let replay = idem
        .execute("race-execute", &"body", || async { Ok::<u32, String>(0) })
        .await;
    assert!(
        matches!(replay, Ok(42)),
        "the outcome did not replay: {replay:?}"
    );
}
