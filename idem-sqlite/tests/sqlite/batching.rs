//! Group commit under concurrency: many callers share transactions, and
//! each still gets exactly its own answer.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Insert, State, Store, Token};
use idem_core::Idempotent;
use idem_sqlite::SqliteStore;

use crate::support::{fresh, in_flight};

const HOUR: Duration = Duration::from_secs(3600);

fn outcome(key: &str) -> String {
    format!("outcome of {key}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_executions_of_one_key_run_the_work_once() {
    let (store, _dir, _) = fresh().await;
    let idem = Idempotent::new(store).with_wait(Duration::from_secs(20));
    let runs = Arc::new(AtomicUsize::new(0));
    let calls = (0..64).map(|_| {
        let (idem, runs) = (idem.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            idem.execute("one-key", "body", || async {
                runs.fetch_add(1, Ordering::SeqCst);
                // Long enough that the other callers arrive while it runs.
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, Infallible>(outcome("one-key"))
            })
            .await
        })
    });
    for call in futures_join(calls).await {
        assert_eq!(
            call.expect("every caller gets the outcome"),
            outcome("one-key")
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_distinct_keys_executed_at_once_are_all_recorded() {
    let (store, _dir, path) = fresh().await;
    let idem = Idempotent::new(store);
    let runs = Arc::new(AtomicUsize::new(0));
    let keys: Vec<String> = (0..500).map(|i| format!("key-{i}")).collect();
    let run_all = |idem: Idempotent, runs: Arc<AtomicUsize>| {
        futures_join(keys.clone().into_iter().map(move |key| {
            let (idem, runs) = (idem.clone(), Arc::clone(&runs));
            tokio::spawn(async move {
                let value = idem
                    .execute(&key, &key, || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Infallible>(outcome(&key))
                    })
                    .await;
                (key, value)
            })
        }))
    };
    for (key, value) in run_all(idem.clone(), Arc::clone(&runs)).await {
        assert_eq!(value.expect("recorded"), outcome(&key));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 500);
    // Every retry replays, all at once too, and nothing runs again.
    for (key, value) in run_all(idem.clone(), Arc::clone(&runs)).await {
        assert_eq!(value.expect("replayed"), outcome(&key));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 500, "no retry ran the work");

    drop(idem);
    let reopened = SqliteStore::open(&path).await.unwrap();
    for key in &keys {
        let record = reopened.load(&key_of(key)).await.unwrap().expect("on disk");
        assert_eq!(record.state, State::Completed);
        let stored: String = serde_json::from_slice(&record.payload).unwrap();
        assert_eq!(stored, outcome(key));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_inserts_of_one_absent_key_insert_it_exactly_once() {
    let (store, _dir, _) = fresh().await;
    let store = Arc::new(store);
    let inserts = (0..64).map(|_| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let token = Token::random();
            (
                token,
                store
                    .insert("contended", &in_flight(token, HOUR, HOUR))
                    .await,
            )
        })
    });
    let answers = futures_join(inserts).await;
    let winners: Vec<Token> = answers
        .iter()
        .filter(|(_, answer)| matches!(answer, Ok(Insert::Inserted)))
        .map(|(token, _)| *token)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one insert wins");
    for (_, answer) in &answers {
        match answer {
            Ok(Insert::Inserted) => {}
            Ok(Insert::Found(found)) => assert_eq!(found.token, winners[0]),
            other => panic!("unexpected answer {other:?}"),
        }
    }
}

/// The key `Idempotent` stores a client key under, with no namespace or
/// scope.
fn key_of(client_key: &str) -> String {
    Idempotent::new(idem_core::MemoryStore::new())
        .key(client_key)
        .expect("a valid key")
        .as_str()
        .to_owned()
}

/// Awaits spawned tasks in order; a panicked task fails the test.
async fn futures_join<T: Send + 'static>(
    tasks: impl IntoIterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let tasks: Vec<_> = tasks.into_iter().collect();
    let mut done = Vec::with_capacity(tasks.len());
    for task in tasks {
        done.push(task.await.expect("the task completes"));
    }
    done
}
