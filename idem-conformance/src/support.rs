//! Helpers the cases share: keys, records, clocks and checked store calls.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use idem_core::store::{Insert, NewRecord, Record, State, Store, Token};
use idem_core::{Fingerprint, Idempotent, Key};
use tokio::time::Instant;

/// A lease for cases that wait for it to lapse: short enough to keep the kit
/// fast, long enough that a loaded machine does not lapse it by accident.
pub(crate) const LEASE: Duration = Duration::from_millis(300);

/// A lease no case outlives.
pub(crate) const LONG: Duration = Duration::from_secs(30);

/// Retention for records that must outlive the case.
pub(crate) const RETENTION: Duration = Duration::from_secs(60);

/// Extra time past a deadline before a case relies on it having passed, for
/// clock granularity and the gap between a store's clock and ours.
pub(crate) const SLACK: Duration = Duration::from_millis(40);

/// How long bounded polling waits for a store to show a state.
pub(crate) const PATIENCE: Duration = Duration::from_secs(3);

/// How often bounded polling looks.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// The namespace every case writes under.
pub(crate) const NAMESPACE: &str = "idem-conformance";

/// The storage form of a client key, as `Idempotent` would build it.
pub(crate) fn key(client_key: &str) -> String {
    scoped_key("", client_key)
}

/// The storage form of a client key within a scope.
pub(crate) fn scoped_key(scope: &str, client_key: &str) -> String {
    match Key::new(NAMESPACE, scope, client_key) {
        Ok(key) => key.as_str().to_owned(),
        Err(e) => panic!("the kit built an invalid key {client_key:?}: {e}"),
    }
}

/// A fingerprint named by a number.
pub(crate) fn fp(n: u8) -> Fingerprint {
    Fingerprint::of_bytes(&[n])
}

/// A claim: `InFlight` with `lease`, kept for [`RETENTION`].
pub(crate) fn in_flight(
    token: Token,
    fingerprint: Fingerprint,
    lease: Duration,
) -> NewRecord<'static> {
    NewRecord {
        token,
        fingerprint,
        state: State::InFlight,
        payload: &[],
        lease: Some(lease),
        retention: idem_core::store::clamp::retention(RETENTION, lease),
    }
}

/// A claim that vanishes after `retention`.
pub(crate) fn short_lived(
    token: Token,
    lease: Duration,
    retention: Duration,
) -> NewRecord<'static> {
    NewRecord {
        retention,
        ..in_flight(token, fp(0), lease)
    }
}

/// A final record (`Completed` or `Failed`) holding `payload`.
pub(crate) fn settled<'a>(
    token: Token,
    fingerprint: Fingerprint,
    state: State,
    payload: &'a [u8],
    retention: Duration,
) -> NewRecord<'a> {
    NewRecord {
        token,
        fingerprint,
        state,
        payload,
        lease: None,
        retention,
    }
}

/// An `Idempotent` over the fixture's store with the kit's short lease.
pub(crate) fn idempotent(store: Arc<dyn Store>) -> Idempotent {
    Idempotent::from_arc(store)
        .with_lease(LEASE)
        .with_namespace(NAMESPACE)
}

/// Inserts `record`, which the case knows to be the first under `key`.
pub(crate) async fn claim(store: &dyn Store, key: &str, record: &NewRecord<'_>) {
    match store.insert(key, record).await {
        Ok(Insert::Inserted) => {}
        Ok(found) => panic!("insert into an absent key {key:?} found a record: {found:?}"),
        Err(e) => panic!("insert failed: {e}"),
    }
}

/// Claims the absent `key` and records `payload` as its final `state`
/// (`Completed` or `Failed`); returns the owner's token.
pub(crate) async fn final_record(
    store: &dyn Store,
    key: &str,
    state: State,
    payload: &[u8],
) -> Token {
    let token = Token::random();
    claim(store, key, &in_flight(token, fp(1), LONG)).await;
    let done = settled(token, fp(1), state, payload, RETENTION);
    match store.swap(key, token, &done).await {
        Ok(true) => token,
        Ok(false) => panic!("the owner of {key:?} could not record its {state:?} outcome"),
        Err(e) => panic!("swap failed: {e}"),
    }
}

/// Loads the live record under `key`, which the case knows is there.
pub(crate) async fn live(store: &dyn Store, key: &str) -> Record {
    match store.load(key).await {
        Ok(Some(record)) => record,
        Ok(None) => panic!("load found no record under {key:?}, where a live one must be"),
        Err(e) => panic!("load failed: {e}"),
    }
}

/// Loads `key`, which the case knows is absent.
pub(crate) async fn absent(store: &dyn Store, key: &str, why: &str) {
    match store.load(key).await {
        Ok(None) => {}
        Ok(Some(record)) => panic!("load returned a record {why}: {record:?}"),
        Err(e) => panic!("load failed: {e}"),
    }
}

/// Unwraps a store call's result, naming the call on failure.
pub(crate) fn ok<T>(result: Result<T, idem_core::store::StoreError>, call: &str) -> T {
    result.unwrap_or_else(|e| panic!("{call} failed: {e}"))
}

/// Sleeps until `after` has passed since `since`, plus [`SLACK`]. Used only
/// to let a deadline pass, never to wait for a state to show.
pub(crate) async fn pass(since: Instant, after: Duration) {
    tokio::time::sleep_until(since + after + SLACK).await;
}

/// Polls `key` until its record shows a lapsed lease; panics after
/// [`PATIENCE`].
pub(crate) async fn until_lease_lapsed(store: &dyn Store, key: &str) -> Record {
    let give_up = Instant::now() + PATIENCE;
    loop {
        let record = live(store, key).await;
        if record.lease_lapsed() {
            return record;
        }
        if Instant::now() >= give_up {
            panic!("the lease under {key:?} never lapsed: {record:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `len` bytes that cover every byte value and do not repeat in a short
/// cycle, so a truncation or a shifted chunk shows.
pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// Asserts that two payloads are equal, with a message that stays readable
/// for payloads of several MiB.
pub(crate) fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: {} bytes came back for {} written, first difference at byte {at}",
        got.len(),
        want.len()
    );
}

/// Waits for every task in `tasks`, re-raising the first panic so a case
/// fails with the task's own message.
pub(crate) async fn join_all<T: 'static>(mut tasks: tokio::task::JoinSet<T>) -> Vec<T> {
    let mut outputs = Vec::with_capacity(tasks.len());
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(output) => outputs.push(output),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a task of the case was cancelled: {e}"),
        }
    }
    outputs
}

/// A store call boxed so that calls of one race can be listed together.
pub(crate) type Call<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs `calls` in this task, polling every unfinished call once per turn,
/// in the order given, until all are done; returns their outputs in that
/// order.
///
/// The first turn runs each call up to its first await that is not ready,
/// before any call goes on: a store that checks, awaits and then writes is
/// met by every later racer between its check and its write, on every run
/// and whatever the runtime's scheduling. Spawned racers (a barrier on
/// several threads) only make that likely; the race cases run both.
pub(crate) async fn in_turn<T>(calls: Vec<Call<'_, T>>) -> Vec<T> {
    let mut calls: Vec<Option<Call<'_, T>>> = calls.into_iter().map(Some).collect();
    let mut outputs: Vec<Option<T>> = calls.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (slot, output) in calls.iter_mut().zip(outputs.iter_mut()) {
            if let Some(call) = slot {
                match call.as_mut().poll(cx) {
                    Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// How a race case starts its racers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Polled in turn in the case's task ([`in_turn`]): every racer meets
    /// every other between its first and second step, on every run.
    InTurn,
    /// Each racer a task of its own, released together by a barrier, so
    /// racers on several threads meet inside a store that does not await.
    Spawned,
}

impl Start {
    /// Both ways, the deterministic one first.
    pub(crate) const BOTH: [Start; 2] = [Start::InTurn, Start::Spawned];
}

/// Runs `racers` started as `start` says; the outputs come in the given
/// order for [`Start::InTurn`] and in the order the racers end for
/// [`Start::Spawned`], so each output names its racer.
pub(crate) async fn race<T: Send + 'static>(start: Start, racers: Vec<Call<'static, T>>) -> Vec<T> {
    match start {
        Start::InTurn => in_turn(racers).await,
        Start::Spawned => {
            let barrier = Arc::new(tokio::sync::Barrier::new(racers.len()));
            let mut tasks = tokio::task::JoinSet::new();
            for racer in racers {
                let barrier = Arc::clone(&barrier);
                tasks.spawn(async move {
                    barrier.wait().await;
                    racer.await
                });
            }
            join_all(tasks).await
        }
    }
}
