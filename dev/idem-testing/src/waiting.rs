//! Scenarios that prove a store's wake-ups ([`Store::wakeups`]): the same
//! checks for every store that sends them, run by each store's own tests
//! on its real server.
//!
//! Each scenario counts the store's claims (`insert`s, the reads a waiter
//! makes) through [`CountingStore`], and sets the waiter's polling to an
//! hour, so that only a wake-up can bring it its outcome before its
//! deadline: a store whose notifications do not arrive fails with
//! `InProgress`, not with a slow timing.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Insert, NewRecord, Record, Store, StoreError, Token, Wakeups};
use idem_core::{Begin, Fingerprint, Idempotent};

/// A waiter's polling in these scenarios: so long that only a wake-up
/// brings the outcome within its deadline.
pub const NO_POLLING: Duration = Duration::from_secs(3600);

/// How long a waiter waits in these scenarios before it gives up.
pub const WAIT: Duration = Duration::from_secs(10);

/// How soon after the completion a woken waiter must have its outcome:
/// half its wait, so its last read at the deadline cannot pass for a
/// wake-up.
pub const WOKEN: Duration = Duration::from_secs(5);

/// A real store that counts its `insert`s (every claim and every read a
/// waiter makes) and passes every call, wake-ups included, through.
///
/// It counts each call twice: when it is made ([`inserts`](Self::inserts))
/// and when the store has answered it ([`answered`](Self::answered)). A
/// waiter is parked only once its last read has been answered: a read that
/// is made but not yet answered may still find the outcome on its own.
#[derive(Clone)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    inserts: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

impl CountingStore {
    /// Counts the calls made to `inner`.
    pub fn new(inner: Arc<dyn Store>) -> CountingStore {
        CountingStore {
            inner,
            inserts: Arc::new(AtomicUsize::new(0)),
            answered: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// How many `insert`s were made so far.
    pub fn inserts(&self) -> usize {
        self.inserts.load(Ordering::SeqCst)
    }

    /// How many `insert`s the store has answered so far.
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for CountingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingStore")
            .field("inner", &self.inner)
            .field("inserts", &self.inserts())
            .field("answered", &self.answered())
            .finish()
    }
}

#[async_trait::async_trait]
impl Store for CountingStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        self.inserts.fetch_add(1, Ordering::SeqCst);
        let answer = self.inner.insert(key, record).await;
        self.answered.fetch_add(1, Ordering::SeqCst);
        answer
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.swap(key, expected, record).await
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.take_over(key, expected, record).await
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        self.inner.remove(key, expected).await
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.load(key).await
    }

    async fn reset(&self, key: &str) -> Result<idem_core::store::Reset, StoreError> {
        self.inner.reset(key).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }

    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        self.inner.wakeups()
    }
}

/// The store's wake-ups, once its listener is connected (at most 10 s).
///
/// # Panics
/// When the store sends no wake-ups or its listener does not connect.
pub async fn connected_wakeups(store: &dyn Store) -> Arc<Wakeups> {
    let wakeups = store.wakeups().expect("the store sends wake-ups");
    until("the wake-up listener connects", || wakeups.is_connected()).await;
    wakeups
}

/// Polls `done` every few milliseconds for up to 10 s.
///
/// # Panics
/// When `done` stays false; the message names `what`.
pub async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("gave up waiting until {what}");
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of_bytes(b"the same request")
}

/// A waiter parked on `key` by `idem` is woken by the owner's completion,
/// not by a poll: it reads the record exactly once more after the owner
/// completes, and gets the outcome long before its next poll.
///
/// # Panics
/// When the waiter is not woken, reads more than once, or gets another
/// outcome.
pub async fn a_waiter_is_woken_by_the_store(store: Arc<dyn Store>, key: &str) {
    let counting = CountingStore::new(store);
    connected_wakeups(&counting).await;
    let idem = Idempotent::new(counting.clone()).with_wait_polling(NO_POLLING, NO_POLLING);
    let Begin::Run(lease) = idem.begin(key, fingerprint()).await.unwrap() else {
        panic!("the key was fresh");
    };
    let waiter = tokio::spawn({
        let (idem, key) = (idem.clone().with_wait(WAIT), key.to_owned());
        async move { idem.begin(&key, fingerprint()).await }
    });
    // The owner's claim, the waiter's first read and its read after it
    // began watching, all answered: then it is parked. (Counting the reads
    // made, a third read still on its way could find the completion itself
    // and leave no wake-up to observe.)
    until("the waiter is parked", || counting.answered() == 3).await;
    lease.complete(b"11").await.unwrap();
    let answer = tokio::time::timeout(WOKEN, waiter)
        .await
        .expect("the waiter was not woken by the completion");
    match answer.unwrap() {
        Ok(Begin::Replay(replay)) => assert_eq!(replay.payload(), b"11"),
        other => panic!("the waiter did not get the outcome: {other:?}"),
    }
    assert_eq!(counting.inserts(), 4, "one read after the wake-up");
}

/// A waiter whose wake-up is lost while the store's listener connection is
/// down still gets the outcome (it polls while notifications do not
/// flow), and the listener reconnects so the next waiter is woken again.
/// `kill` cuts the store's listener connection from the server side.
///
/// # Panics
/// When the waiter does not get the outcome, or the listener does not
/// come back.
pub async fn a_lost_wake_up_costs_only_latency<K, F>(store: Arc<dyn Store>, key: &str, kill: K)
where
    K: FnOnce() -> F,
    F: std::future::Future<Output = ()>,
{
    let counting = CountingStore::new(store);
    let wakeups = connected_wakeups(&counting).await;
    let idem = Idempotent::new(counting.clone()).with_wait(Duration::from_secs(20));
    let Begin::Run(lease) = idem.begin(key, fingerprint()).await.unwrap() else {
        panic!("the key was fresh");
    };
    let waiter = tokio::spawn({
        let (idem, key) = (idem.clone(), key.to_owned());
        async move { idem.begin(&key, fingerprint()).await }
    });
    until("the waiter is parked", || counting.answered() >= 3).await;
    kill().await;
    until("the store sees its listener is gone", || {
        wakeups.disconnections() > 0
    })
    .await;
    lease.complete(b"12").await.unwrap();
    match waiter.await.unwrap() {
        Ok(Begin::Replay(replay)) => assert_eq!(replay.payload(), b"12"),
        other => panic!("the waiter lost the outcome: {other:?}"),
    }
    // The listener comes back and wakes waiters again.
    a_waiter_is_woken_by_the_store(counting.inner.clone(), &format!("{key}-again")).await;
}

/// `trials` races between an owner's completion and a waiter's arrival,
/// the completion landing anywhere from before the waiter's first read to
/// after it parked; returns how many waiters lost their wake-up (had no
/// outcome [`WOKEN`] after the completion). Waiters poll only every hour,
/// so a lost wake-up is never hidden by a poll.
pub async fn lost_wake_ups_in_races(store: Arc<dyn Store>, prefix: &str, trials: usize) -> usize {
    connected_wakeups(&*store).await;
    let idem = Idempotent::from_arc(store)
        .with_wait_polling(NO_POLLING, NO_POLLING)
        .with_wait(WAIT);
    let mut lost = 0;
    let batch = 16;
    for first in (0..trials).step_by(batch) {
        let mut races = Vec::new();
        for trial in first..(first + batch).min(trials) {
            let (idem, key) = (idem.clone(), format!("{prefix}-{trial}"));
            races.push(tokio::spawn(async move {
                let Begin::Run(lease) = idem.begin(&key, fingerprint()).await.unwrap() else {
                    panic!("the key was fresh");
                };
                let waiter = tokio::spawn({
                    let (idem, key) = (idem.clone(), key.clone());
                    async move { idem.begin(&key, fingerprint()).await }
                });
                // Spread the completion over the waiter's first steps.
                for _ in 0..(trial % 7) {
                    tokio::task::yield_now().await;
                }
                if trial % 3 == 0 {
                    tokio::time::sleep(Duration::from_micros(200 * (trial % 11) as u64)).await;
                }
                lease.complete(b"7").await.unwrap();
                let Ok(answer) = tokio::time::timeout(WOKEN, waiter).await else {
                    return true;
                };
                match answer.unwrap() {
                    Ok(Begin::Replay(replay)) => {
                        assert_eq!(replay.payload(), b"7");
                        false
                    }
                    other => panic!("unexpected answer: {other:?}"),
                }
            }));
        }
        for race in races {
            lost += usize::from(race.await.unwrap());
        }
    }
    lost
}
