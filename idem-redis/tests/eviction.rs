//! Records on a Redis whose memory fills: each maxmemory policy on a
//! server of its own with an 8 MB cap, shared with a cache that another
//! client fills until the server refuses writes. Every execution is
//! counted: the store must lose no recorded outcome and run no work twice
//! where it serves, refuse plainly where it cannot, and say whether the
//! work ran when the full server refuses its own writes.

#[allow(dead_code)]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::StoreErrorKind;
use idem_core::{Begin, Error, Fingerprint, Idempotent, When};
use idem_redis::RedisStore;
use support::servers::{self, Servers};

/// Records made before the cache fills, and replayed after.
const RECORDS: usize = 300;

fn server(policy: &str) -> Option<Servers> {
    if let Some(reason) = servers::binaries_missing() {
        support::skip_binary(&reason);
    }
    Some(
        Servers::standalone_with(&format!("--maxmemory 8mb --maxmemory-policy {policy}"))
            .unwrap_or_else(|e| panic!("cannot start redis-server: {e}")),
    )
}

/// Writes cache entries of 1 KiB, half with an expiry and half without,
/// until the server refuses a write for lack of memory; returns how many
/// keys the server evicted meanwhile.
async fn fill_cache(url: &str) -> u64 {
    let mut redis = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let value = vec![b'c'; 1024];
    // 8 MB holds fewer than 8,192 such entries: 64,000 writes without a
    // refusal would mean nothing is ever full.
    for batch in 0..640 {
        let mut pipe = redis::pipe();
        for i in 0..100 {
            let key = format!("cache:{batch}:{i}");
            if i % 2 == 0 {
                pipe.cmd("SET").arg(&key).arg(&value).arg("PX").arg(600_000);
            } else {
                pipe.cmd("SET").arg(&key).arg(&value);
            }
            pipe.ignore();
        }
        match pipe.query_async::<()>(&mut redis).await {
            Ok(()) => {}
            Err(error) if error.to_string().contains("OOM") => break,
            Err(error) => panic!("filling the cache: {error}"),
        }
    }
    // A pipeline's own buffers count until it is answered: top up one
    // write at a time until one is refused, so the server stays full.
    for i in 0..100_000 {
        let set = redis::cmd("SET")
            .arg(format!("cache:top-up:{i}"))
            .arg(&value)
            .query_async::<()>(&mut redis)
            .await;
        match set {
            Ok(()) => {}
            Err(error) if error.to_string().contains("OOM") => {
                return info_field(url, "stats", "evicted_keys").await;
            }
            Err(error) => panic!("filling the cache: {error}"),
        }
    }
    panic!("the cache never filled the server's memory")
}

async fn info_field(url: &str, section: &str, field: &str) -> u64 {
    let mut redis = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut redis)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
}

/// The payment of key `i`: runs the work, counted, and returns its
/// outcome.
async fn pay(idem: &Idempotent, runs: &AtomicUsize, i: usize) -> Result<String, Error<String>> {
    idem.execute(
        &format!("payment-{i}"),
        &serde_json::json!({ "amount": i }),
        || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(format!("charge ch_{i}"))
        },
    )
    .await
}

/// Records [`RECORDS`] payments, fills the cache, retries them all: 0
/// second runs, 0 lost outcomes. Then, on the full server, a new payment
/// is refused before its work runs, and an outcome that cannot be stored
/// says the work ran.
async fn serves_through_a_full_server(policy: &str) {
    let Some(server) = server(policy) else { return };
    let url = &server.urls()[0];
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("{policy}: the store must connect: {e}"));
    let idem = Idempotent::new(store);
    let runs = AtomicUsize::new(0);
    for i in 0..RECORDS {
        assert_eq!(
            pay(&idem, &runs, i).await.unwrap(),
            format!("charge ch_{i}")
        );
    }
    // A claim held across the fill, completed once the server is full.
    let held = Fingerprint::of_bytes(b"held");
    let Begin::Run(lease) = idem.begin("held", held).await.unwrap() else {
        panic!("could not claim held")
    };

    let evicted = fill_cache(url).await;
    eprintln!("{policy}: the cache filled the server; {evicted} keys evicted");

    let mut lost = 0;
    for i in 0..RECORDS {
        match pay(&idem, &runs, i).await {
            Ok(outcome) => assert_eq!(outcome, format!("charge ch_{i}"), "{policy}"),
            Err(error) => panic!("{policy}: payment-{i} on retry: {error:?}"),
        }
        if runs.load(Ordering::SeqCst) > RECORDS {
            lost += 1;
        }
    }
    let second_runs = runs.load(Ordering::SeqCst) - RECORDS;
    eprintln!("{policy}: {second_runs} second runs, {lost} lost outcomes of {RECORDS}");
    assert_eq!(second_runs, 0, "{policy}: recorded payments ran again");

    // The full server refuses the store's writes: a new claim fails before
    // the work runs, a completion after it. A server at its cap by a few
    // bytes may take a write once a client's buffers shrink, so the cap
    // is set 1 MB under what the server holds.
    let used = info_field(url, "memory", "used_memory").await;
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used - (1 << 20))
        .query_async(&mut admin)
        .await
        .unwrap();
    let before = runs.load(Ordering::SeqCst);
    match pay(&idem, &runs, RECORDS).await {
        Err(Error::Store {
            when: When::BeforeWork,
            source,
        }) => assert_eq!(source.kind(), StoreErrorKind::Backend, "{source}"),
        other => panic!("{policy}: a new claim on a full server: {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        before,
        "{policy}: the work ran"
    );
    match lease.complete(b"\"done\"").await {
        Err(Error::Store {
            when: When::AfterWork,
            ..
        }) => {}
        other => panic!("{policy}: a completion on a full server: {other:?}"),
    }
    // The claim it could not settle still holds the key: no second run.
    assert!(matches!(
        idem.begin("held", held).await,
        Err(Error::InProgress { .. })
    ));
}

#[tokio::test]
async fn noeviction_loses_nothing_and_says_whether_the_work_ran() {
    serves_through_a_full_server("noeviction").await;
}

#[tokio::test]
async fn volatile_lru_never_evicts_a_record() {
    serves_through_a_full_server("volatile-lru").await;
}

#[tokio::test]
async fn volatile_ttl_never_evicts_a_record() {
    serves_through_a_full_server("volatile-ttl").await;
}

#[tokio::test]
async fn an_allkeys_policy_is_refused_with_what_to_change() {
    let Some(server) = server("allkeys-lru") else {
        return;
    };
    let url = &server.urls()[0];
    let error = RedisStore::connect(url.as_str())
        .await
        .expect_err("a store on allkeys-lru must refuse");
    assert_eq!(error.kind(), StoreErrorKind::Config, "{error}");
    let message = error.to_string();
    for needed in ["allkeys-lru", "maxmemory-policy", "noeviction", "volatile-"] {
        assert!(message.contains(needed), "{message}");
    }
    eprintln!("allkeys-lru: {message}");

    // Accepted by name, the store serves, and the cache evicts its
    // records: the risk the option names.
    let store = RedisStore::connect(url.as_str())
        .await
        .map(|store| store.with_record_eviction_allowed(true));
    assert!(store.is_err(), "connect checks before options apply");
    let client = redis::Client::open(url.as_str()).unwrap();
    let connection = client.get_connection_manager().await.unwrap();
    let idem = Idempotent::new(
        RedisStore::from_connection(connection.clone()).with_record_eviction_allowed(true),
    );
    let runs = AtomicUsize::new(0);
    for i in 0..RECORDS {
        pay(&idem, &runs, i).await.unwrap();
    }
    let refused = Idempotent::new(RedisStore::from_connection(connection));
    match pay(&refused, &runs, RECORDS).await {
        Err(Error::Store {
            when: When::BeforeWork,
            source,
        }) => assert_eq!(source.kind(), StoreErrorKind::Config, "{source}"),
        other => panic!("a claim on allkeys-lru: {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), RECORDS, "a refused claim ran");
    let evicting = tokio::spawn({
        let url = url.clone();
        async move { fill_until_evicted(&url).await }
    });
    evicting.await.unwrap();
    for i in 0..RECORDS {
        pay(&idem, &runs, i).await.unwrap();
    }
    let second_runs = runs.load(Ordering::SeqCst) - RECORDS;
    eprintln!("allkeys-lru, accepted: {second_runs} of {RECORDS} payments ran again");
    assert!(second_runs > 0, "allkeys-lru evicted no record");
}

/// Fills an `allkeys-*` server's cache with four times its memory: it
/// never refuses a write, it evicts.
async fn fill_until_evicted(url: &str) {
    let mut redis = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let value = vec![b'c'; 1024];
    for batch in 0..320 {
        let mut pipe = redis::pipe();
        for i in 0..100 {
            pipe.cmd("SET")
                .arg(format!("cache:{batch}:{i}"))
                .arg(&value)
                .ignore();
        }
        pipe.query_async::<()>(&mut redis).await.unwrap();
    }
}

#[tokio::test]
async fn a_policy_changed_to_allkeys_at_run_time_stops_new_claims() {
    let Some(server) = server("volatile-lru") else {
        return;
    };
    let url = &server.urls()[0];
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap()
        .with_eviction_check_every(Duration::from_millis(20));
    let idem = Idempotent::new(store);
    let runs = Arc::new(AtomicUsize::new(0));
    pay(&idem, &runs, 0).await.unwrap();
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lfu")
        .query_async(&mut admin)
        .await
        .unwrap();
    // Bounded polling: the next reading is due within 20 ms.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut i = 1;
    let refusal = loop {
        match pay(&idem, &runs, i).await {
            Ok(_) => i += 1,
            Err(error) => break error,
        }
        assert!(std::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    match refusal {
        Error::Store {
            when: When::BeforeWork,
            source,
        } => {
            assert_eq!(source.kind(), StoreErrorKind::Config);
            assert!(source.to_string().contains("allkeys-lfu"), "{source}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), i, "a refused claim ran");
    // A recorded outcome still replays.
    assert_eq!(pay(&idem, &runs, 0).await.unwrap(), "charge ch_0");
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut admin)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while pay(&idem, &runs, 10_000).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
