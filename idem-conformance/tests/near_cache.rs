//! The near cache answers only what the store would: it never serves a
//! record in flight, never outlives the retention the store reported nor
//! its cap, decides a mismatch as the store would, and leaves exactly one
//! winner among concurrent first executions. Each case passes through
//! `NearCache` and is caught against a cache with one deliberate flaw
//! (`broken/near.rs`). The whole kit also runs through `NearCache` on every
//! store (each store's `tests/conformance.rs`, module `near_cache`).

#[path = "broken/near.rs"]
mod flawed;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flawed::{CacheFlaw, FlawedCache};
use idem_core::store::{
    Insert, NearCache, NewRecord, Record, Reset, State, Store, StoreError, Token,
};
use idem_core::{Error, Fingerprint, Idempotent, MemoryStore};
use tokio::sync::Notify;

/// Builds a cache over a store, capped at an age.
type Make = Arc<dyn Fn(Arc<dyn Store>, Duration) -> Arc<dyn Store> + Send + Sync>;

fn near() -> Make {
    Arc::new(|store, age| Arc::new(NearCache::new(store).with_max_age(age)))
}

fn flawed(flaw: CacheFlaw) -> Make {
    Arc::new(move |store, age| Arc::new(FlawedCache::new(flaw, store, age)))
}

/// The memory store, counting the claims that reach it; once armed, the
/// next claim holds its answer until it is released.
#[derive(Debug, Default)]
struct Counted {
    store: MemoryStore,
    inserts: AtomicUsize,
    armed: AtomicBool,
    reached: Notify,
    release: Notify,
}

impl Counted {
    fn inserts(&self) -> usize {
        self.inserts.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Store for Counted {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        self.inserts.fetch_add(1, Ordering::SeqCst);
        let answer = self.store.insert(key, record).await;
        if self.armed.swap(false, Ordering::SeqCst) {
            self.reached.notify_one();
            self.release.notified().await;
        }
        answer
    }
    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.store.swap(key, expected, record).await
    }
    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.store.take_over(key, expected, record).await
    }
    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        self.store.remove(key, expected).await
    }
    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.store.load(key).await
    }
    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        self.store.reset(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.store.purge_expired(limit).await
    }
}

const KEY: &str = "near-cache-case";
const LONG: Duration = Duration::from_secs(3600);

fn claim(token: Token, fingerprint: Fingerprint) -> NewRecord<'static> {
    NewRecord {
        token,
        fingerprint,
        state: State::InFlight,
        payload: &[],
        lease: Some(Duration::from_secs(30)),
        retention: LONG,
    }
}

fn done(token: Token, fingerprint: Fingerprint, retention: Duration) -> NewRecord<'static> {
    NewRecord {
        token,
        fingerprint,
        state: State::Completed,
        payload: b"done",
        lease: None,
        retention,
    }
}

/// Writes a completed record under [`KEY`] straight into `store`.
async fn settle(store: &dyn Store, fingerprint: Fingerprint, retention: Duration) {
    let token = Token::random();
    let claimed = store.insert(KEY, &claim(token, fingerprint)).await.unwrap();
    assert_eq!(claimed, Insert::Inserted);
    assert!(store
        .swap(KEY, token, &done(token, fingerprint, retention))
        .await
        .unwrap());
}

async fn found(store: &dyn Store) -> Option<Record> {
    match store
        .insert(KEY, &claim(Token::random(), Fingerprint::of_bytes(b"a")))
        .await
        .unwrap()
    {
        Insert::Found(record) => Some(record),
        Insert::Inserted => None,
        other => panic!("unexpected answer {other:?}"),
    }
}

/// A claim found in flight and read in flight is not kept: once the owner
/// completes it, the next claim gets the completion.
async fn never_serves_an_in_flight_record(make: Make) {
    let store: Arc<dyn Store> = Arc::new(Counted::default());
    let cache = make(Arc::clone(&store), LONG);
    let (owner, fingerprint) = (Token::random(), Fingerprint::of_bytes(b"a"));
    assert_eq!(
        cache.insert(KEY, &claim(owner, fingerprint)).await.unwrap(),
        Insert::Inserted
    );
    let seen = found(&*cache).await.expect("the claim is found");
    assert_eq!(seen.state, State::InFlight);
    let read = cache.load(KEY).await.unwrap().expect("the claim is read");
    assert_eq!(read.state, State::InFlight);

    assert!(cache
        .swap(KEY, owner, &done(owner, fingerprint, LONG))
        .await
        .unwrap());
    let after = found(&*cache).await.expect("the completion is found");
    assert_eq!(
        after.state,
        State::Completed,
        "a record in flight was served from the cache"
    );
    assert_eq!(after.payload, b"done");
    let read = cache
        .load(KEY)
        .await
        .unwrap()
        .expect("the completion is read");
    assert_eq!(read.state, State::Completed);
}

/// An entry ends when the retention the store reported ends, well before
/// the cap: the next claim reaches the store and finds the key absent.
async fn never_outlives_the_retention(make: Make) {
    let counted = Arc::new(Counted::default());
    let store: Arc<dyn Store> = Arc::clone(&counted) as Arc<dyn Store>;
    let cache = make(Arc::clone(&store), LONG);
    let retention = Duration::from_secs(10);
    settle(&*store, Fingerprint::of_bytes(b"a"), retention).await;
    let first = found(&*cache).await.expect("the completion is found");
    assert!(first.retention_remaining <= retention);
    let reached = counted.inserts();
    tokio::time::advance(retention / 2).await;
    let kept = found(&*cache).await.expect("still kept");
    assert_eq!(counted.inserts(), reached, "the cache answered no replay");
    assert!(kept.retention_remaining <= retention / 2, "{kept:?}");

    tokio::time::advance(retention / 2 + Duration::from_millis(1)).await;
    assert_eq!(
        found(&*cache).await,
        None,
        "the cache answered for a record past the retention the store reported"
    );
}

/// An entry ends at the cap, however long the store said the record has
/// left: the next claim reaches the store.
async fn never_outlives_the_cap(make: Make) {
    let counted = Arc::new(Counted::default());
    let store: Arc<dyn Store> = Arc::clone(&counted) as Arc<dyn Store>;
    let cap = Duration::from_secs(5);
    let cache = make(Arc::clone(&store), cap);
    settle(&*store, Fingerprint::of_bytes(b"a"), LONG).await;
    found(&*cache).await.expect("the completion is found");
    let reached = counted.inserts();
    tokio::time::advance(cap - Duration::from_millis(1)).await;
    let kept = found(&*cache).await.expect("still kept");
    assert_eq!(counted.inserts(), reached, "the cache answered no replay");
    assert!(kept.retention_remaining <= cap, "{kept:?}");

    tokio::time::advance(Duration::from_millis(2)).await;
    let again = found(&*cache).await.expect("the store still holds it");
    assert_eq!(
        counted.inserts(),
        reached + 1,
        "the cache answered past its cap"
    );
    assert!(
        again.retention_remaining > cap,
        "the store's own answer: {again:?}"
    );
}

/// Through the cache, each request gets the answer the store gives it
/// directly: its own body replays, another body is a mismatch, and the
/// work never runs.
async fn a_mismatch_from_the_cache_is_the_store_s_decision(make: Make) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let direct = Idempotent::from_arc(Arc::clone(&store));
    let cached = Idempotent::from_arc(make(Arc::clone(&store), LONG));
    let ran = AtomicUsize::new(0);
    let work = |n: u32| {
        let ran = &ran;
        move || async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, String>(n)
        }
    };
    assert_eq!(direct.execute("k", &"first", work(1)).await.unwrap(), 1);
    for round in 0..2 {
        for body in ["first", "second", "FIRST", ""] {
            let from_store = direct.execute("k", &body, work(2)).await;
            let from_cache = cached.execute("k", &body, work(3)).await;
            match (from_store, from_cache) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "round {round}, body {body:?}"),
                (Err(Error::Mismatch), Err(Error::Mismatch)) => {}
                (a, b) => panic!("round {round}, body {body:?}: store {a:?}, cache {b:?}"),
            }
        }
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the work ran again");
}

/// Several processes, each with its own cache over one store and each
/// having looked for the key before, run a first execution at once:
/// exactly one runs the work, and every answer is the winner's outcome or
/// "in progress".
async fn concurrent_first_executions_have_exactly_one_winner(make: Make) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let callers: Vec<Arc<dyn Store>> = (0..8).map(|_| make(Arc::clone(&store), LONG)).collect();
    for round in 0..20 {
        let key = format!("race-{round}");
        let ran = Arc::new(AtomicUsize::new(0));
        let looked = Arc::new(tokio::sync::Barrier::new(callers.len()));
        let mut tasks = tokio::task::JoinSet::new();
        for (n, cache) in callers.iter().enumerate() {
            let (cache, key, ran) = (Arc::clone(cache), key.clone(), Arc::clone(&ran));
            let looked = Arc::clone(&looked);
            tasks.spawn(async move {
                let idem = Idempotent::from_arc(Arc::clone(&cache)).with_namespace("race");
                let stored = idem_core::Key::new("race", "", &key).unwrap();
                assert!(cache.load(stored.as_str()).await.unwrap().is_none());
                looked.wait().await;
                idem.execute(&key, &"body", move || async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Ok::<usize, String>(n)
                })
                .await
            });
        }
        let answers = tasks.join_all().await;
        assert_eq!(ran.load(Ordering::SeqCst), 1, "round {round}: {answers:?}");
        let winners: Vec<usize> = answers
            .iter()
            .filter_map(|a| a.as_ref().ok().copied())
            .collect();
        assert!(
            !winners.is_empty() && winners.iter().all(|w| *w == winners[0]),
            "{answers:?}"
        );
        for answer in &answers {
            assert!(
                matches!(answer, Ok(_) | Err(Error::InProgress { .. })),
                "round {round}: {answer:?}"
            );
        }
    }
}

/// A claim that read the completed record before a reset deleted it, and
/// answers after, is not kept: the next claim is a first execution, not a
/// replay of the deleted outcome.
async fn a_read_across_a_reset_is_not_kept(make: Make) {
    let counted = Arc::new(Counted::default());
    let store: Arc<dyn Store> = counted.clone();
    settle(&*store, Fingerprint::of_bytes(b"a"), LONG).await;
    // A cap under the retention: the claim's record is kept as it came,
    // without a second read.
    let cache = make(Arc::clone(&store), Duration::from_secs(60));
    counted.armed.store(true, Ordering::SeqCst);
    let across = tokio::spawn({
        let cache = Arc::clone(&cache);
        async move { found(&*cache).await }
    });
    counted.reached.notified().await;
    let reset = cache.reset(KEY).await.unwrap();
    assert!(matches!(reset, Reset::Deleted(_)), "{reset:?}");
    counted.release.notify_one();
    let seen = across.await.unwrap();
    assert!(seen.is_some_and(|record| record.state == State::Completed));
    assert_eq!(
        found(&*cache).await,
        None,
        "the claim after a reset replayed the deleted record"
    );
}

/// Runs `case` and says whether it passed; a panic is a failure.
async fn passes<F: Future<Output = ()> + Send + 'static>(case: F) -> bool {
    tokio::spawn(case).await.is_ok()
}

macro_rules! near_cases {
    ($($case:ident, $clock:meta, $flaw:ident;)*) => {
        /// Each case through `NearCache` and through the flawless cache.
        mod passes_through_the_near_cache {
            use super::*;
            $(
                #[$clock]
                async fn $case() {
                    super::$case(near()).await;
                    super::$case(flawed(CacheFlaw::None)).await;
                }
            )*
        }

        /// Each case against the cache flaw it must catch.
        mod catches {
            use super::*;
            $(
                #[$clock]
                async fn $case() {
                    assert!(
                        !passes(super::$case(flawed(CacheFlaw::$flaw))).await,
                        "a cache that {:?} passed {}",
                        CacheFlaw::$flaw,
                        stringify!($case)
                    );
                }
            )*
        }
    };
}

near_cases! {
    never_serves_an_in_flight_record, tokio::test, KeepsInFlight;
    never_outlives_the_retention, tokio::test(start_paused = true), IgnoresRetention;
    never_outlives_the_cap, tokio::test(start_paused = true), IgnoresCap;
    a_mismatch_from_the_cache_is_the_store_s_decision, tokio::test, AnswersByKeyAlone;
    concurrent_first_executions_have_exactly_one_winner,
        tokio::test(flavor = "multi_thread", worker_threads = 2), TrustsRememberedAbsence;
    a_read_across_a_reset_is_not_kept, tokio::test, KeepsReadsAcrossResets;
}

async fn found_under(store: &dyn Store, key: &str) -> Record {
    let fingerprint = Fingerprint::of_bytes(b"a");
    match store
        .insert(key, &claim(Token::random(), fingerprint))
        .await
        .unwrap()
    {
        Insert::Found(record) => record,
        other => panic!("{key} is settled, yet: {other:?}"),
    }
}

/// Keeps within its bounds and counts what it does.
#[tokio::test(start_paused = true)]
async fn keeps_within_its_bounds_and_counts() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let cache = NearCache::new(Arc::clone(&store))
        .with_max_entries(3)
        .with_max_bytes(4096);
    let fingerprint = Fingerprint::of_bytes(b"a");
    for n in 0..5 {
        let key = format!("bounded-{n}");
        let token = Token::random();
        store
            .insert(&key, &claim(token, fingerprint))
            .await
            .unwrap();
        store
            .swap(&key, token, &done(token, fingerprint, LONG))
            .await
            .unwrap();
        let first = found_under(&cache, &key).await;
        let again = found_under(&cache, &key).await;
        assert_eq!((first.token, first.payload), (again.token, again.payload));
    }
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses), (5, 5), "{stats:?}");
    assert_eq!((stats.entries, stats.evictions), (3, 2), "{stats:?}");
    assert!(stats.bytes > 0 && stats.bytes <= 4096, "{stats:?}");
    // The oldest went first.
    cache
        .insert("bounded-0", &claim(Token::random(), fingerprint))
        .await
        .unwrap();
    assert_eq!(cache.stats().misses, 6);

    let big = vec![7u8; 8192];
    let token = Token::random();
    store
        .insert("big", &claim(token, fingerprint))
        .await
        .unwrap();
    let record = NewRecord {
        payload: &big,
        ..done(token, fingerprint, LONG)
    };
    store.swap("big", token, &record).await.unwrap();
    cache
        .insert("big", &claim(Token::random(), fingerprint))
        .await
        .unwrap();
    assert!(
        cache.stats().bytes <= 4096,
        "a record over the byte bound was kept"
    );
}
