//! Races every networked store's own tests run the same way: racing
//! claims with one winner, purgers sharing the expired rows. Only the
//! `Store` trait is used, so the PostgreSQL and MariaDB suites (and the
//! next store's) call these instead of keeping a copy each; what differs
//! between them (seeding rows with SQL, watching lock queues) stays there.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Insert, NewRecord, State, Store, Token};
use idem_core::Fingerprint;
use tokio::sync::Barrier;

/// A lease or retention that outlasts any test.
pub const MINUTE: Duration = Duration::from_secs(60);

/// An in-flight record as a claim writes it, for the request `b"request"`.
pub fn in_flight(token: Token, lease: Duration, retention: Duration) -> NewRecord<'static> {
    NewRecord {
        token,
        fingerprint: Fingerprint::of_bytes(b"request"),
        state: State::InFlight,
        payload: &[],
        lease: Some(lease),
        retention,
    }
}

/// `callers` claims of `key` released at once: the tokens that inserted,
/// and the tokens the others found.
pub async fn race<S>(store: &S, key: &str, callers: usize) -> (Vec<Token>, Vec<Token>)
where
    S: Store + Clone + 'static,
{
    let barrier = Arc::new(Barrier::new(callers));
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (store, barrier, key) = (store.clone(), Arc::clone(&barrier), key.to_owned());
            tokio::spawn(async move {
                let token = Token::random();
                barrier.wait().await;
                let outcome = store.insert(&key, &in_flight(token, MINUTE, MINUTE)).await;
                (token, outcome.unwrap())
            })
        })
        .collect();
    let (mut winners, mut seen) = (Vec::new(), Vec::new());
    for task in tasks {
        match task.await.unwrap() {
            (token, Insert::Inserted) => winners.push(token),
            (_, Insert::Found(record)) => seen.push(record.token),
            (_, other) => panic!("unexpected {other:?}"),
        }
    }
    (winners, seen)
}

/// Five rounds of `callers` racing claims, each of a new key (absent, or
/// when `expired` first written with a 20 ms retention and left to
/// expire): exactly one claim inserts, and every other finds its token.
pub async fn racing_claims_have_one_winner<S>(store: &S, callers: usize, expired: bool)
where
    S: Store + Clone + 'static,
{
    let brief = Duration::from_millis(20);
    for round in 0..5 {
        let key = format!("k{round}");
        if expired {
            store
                .insert(&key, &in_flight(Token::random(), brief, brief))
                .await
                .unwrap();
            tokio::time::sleep(brief * 2).await;
        }
        let (winners, seen) = race(store, &key, callers).await;
        assert_eq!(winners.len(), 1, "round {round}");
        assert!(
            seen.iter().all(|token| *token == winners[0]),
            "round {round}"
        );
    }
}

/// Four purgers of 25 rows a call, over a store the caller filled with
/// `expired` expired rows: together they delete each once (the sum of their
/// counts is `expired`, and a last purge finds nothing), and a live record
/// claimed meanwhile stays.
pub async fn purgers_delete_each_expired_row_once<S>(store: &S, expired: usize)
where
    S: Store + Clone + 'static,
{
    let live = Token::random();
    store
        .insert("live", &in_flight(live, MINUTE, MINUTE))
        .await
        .unwrap();
    let purgers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut deleted = 0;
                loop {
                    match store.purge_expired(25).await.unwrap() {
                        0 => return deleted,
                        n => deleted += n,
                    }
                }
            })
        })
        .collect();
    let mut total = 0;
    for purger in purgers {
        total += purger.await.unwrap();
    }
    assert_eq!(total, expired);
    assert_eq!(store.purge_expired(25).await.unwrap(), 0);
    assert_eq!(store.load("live").await.unwrap().unwrap().token, live);
}

#[cfg(test)]
mod tests {
    use idem_core::MemoryStore;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_races_hold_on_the_memory_store() {
        racing_claims_have_one_winner(&Arc::new(MemoryStore::new()), 8, false).await;
        racing_claims_have_one_winner(&Arc::new(MemoryStore::new()), 8, true).await;
        let store = Arc::new(MemoryStore::new());
        let brief = Duration::from_millis(5);
        for n in 0..60 {
            let old = in_flight(Token::random(), brief, brief);
            store.insert(&format!("old{n}"), &old).await.unwrap();
        }
        tokio::time::sleep(brief * 4).await;
        purgers_delete_each_expired_row_once(&store, 60).await;
    }
}
