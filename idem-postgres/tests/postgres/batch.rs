//! Claims of several keys in one statement: each key is inserted only
//! where `insert` would insert it, the claims commit or roll back with the
//! caller's transaction, and racing batches claim each key once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_core::store::{PreparedClaim, State, Store, StoreErrorKind};
use idem_core::{Error, Idempotent};
use idem_postgres::sqlx::{self, Connection};
use idem_postgres::PostgresStore;

use crate::support;

fn claims(idem: &Idempotent, keys: &[&str]) -> Vec<PreparedClaim> {
    keys.iter()
        .map(|key| idem.prepare_claim(key, "body").unwrap())
        .collect()
}

#[tokio::test]
async fn a_batch_claims_only_absent_or_expired_keys() {
    let Some((store, _table)) = support::store().await else {
        return;
    };
    let idem = Idempotent::new(store.clone()).scoped("source");
    // "done" holds a completed outcome, "expired" a record past retention
    // (set back on the server's clock).
    idem.execute("done", "body", || async { Ok::<_, ()>(7) })
        .await
        .unwrap();
    idem.execute("expired", "body", || async { Ok::<_, ()>(8) })
        .await
        .unwrap();
    sqlx::query(&format!(
        "UPDATE {} SET retain_until = now() - interval '1 second' WHERE key = $1",
        store.table()
    ))
    .bind(idem.key("expired").unwrap().as_str())
    .execute(store.pool())
    .await
    .unwrap();

    let mut conn = store.pool().acquire().await.unwrap();
    let batch = claims(&idem, &["a", "done", "expired", "b", "a"]);
    let inserted = store.claim_many_in(&mut conn, &batch).await.unwrap();
    assert_eq!(inserted, [true, false, true, true, false]);
    let mut batch = batch.into_iter();
    let a = batch.next().unwrap().inserted();
    let _done = batch.next();
    let expired = batch.next().unwrap().inserted();
    let b = batch.next().unwrap().inserted();
    // Inserted without a transaction, the claims hold their keys at once.
    let in_flight = idem.execute("a", "body", || async { Ok::<_, ()>(0) }).await;
    assert!(
        matches!(in_flight, Err(Error::InProgress { .. })),
        "{in_flight:?}"
    );
    let record = store.load(a.key().as_str()).await.unwrap().unwrap();
    assert_eq!((record.state, record.token), (State::InFlight, a.token()));

    // The leases settle as after `begin`.
    a.complete(b"1").await.unwrap();
    expired.fail(b"3").await.unwrap();
    b.release().await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    for (key, want) in [("a", 1), ("done", 7)] {
        let counted = Arc::clone(&runs);
        let got = idem
            .execute(key, "body", || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ()>(0)
            })
            .await
            .unwrap();
        assert_eq!(got, want, "{key}");
    }
    let failed = store.load(expired.key().as_str()).await.unwrap().unwrap();
    assert_eq!(
        (failed.state, failed.payload),
        (State::Failed, b"3".to_vec())
    );
    assert!(store.load(b.key().as_str()).await.unwrap().is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(store
        .claim_many_in(&mut conn, &[])
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn claims_roll_back_with_the_transaction() {
    let Some((store, _table)) = support::store().await else {
        return;
    };
    let idem = Idempotent::new(store.clone());
    let mut conn = store.pool().acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let batch = claims(&idem, &["x", "y"]);
    assert_eq!(
        store.claim_many_in(&mut tx, &batch).await.unwrap(),
        [true, true]
    );
    tx.rollback().await.unwrap();
    for claim in &batch {
        assert!(store.load(claim.key().as_str()).await.unwrap().is_none());
    }
    let mut tx = conn.begin().await.unwrap();
    assert_eq!(
        store.claim_many_in(&mut tx, &batch).await.unwrap(),
        [true, true]
    );
    tx.commit().await.unwrap();
    for claim in &batch {
        let record = store.load(claim.key().as_str()).await.unwrap().unwrap();
        assert_eq!(record.token, claim.record().token);
    }
}

#[tokio::test]
async fn a_connection_to_another_database_is_refused() {
    let Some((store, _table)) = support::store().await else {
        return;
    };
    // A store whose pool is on the `postgres` database, naming the same
    // table; the connection it is handed is on the test database, where
    // the table exists, so only the database check can refuse it.
    let url = support::url();
    let (server, _database) = url.rsplit_once('/').unwrap();
    let Some(elsewhere) = support::pool_at(&format!("{server}/postgres"), 1).await else {
        return;
    };
    let other = PostgresStore::from_pool(elsewhere)
        .with_table(&store.table())
        .unwrap();
    let idem = Idempotent::new(store.clone());
    let mut conn = store.pool().acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let refused = other
        .claim_many_in(&mut tx, &claims(&idem, &["z"]))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Config);
    assert!(refused.to_string().contains("roll"), "{refused}");
    tx.rollback().await.unwrap();
    let key = idem.key("z").unwrap();
    assert!(store.load(key.as_str()).await.unwrap().is_none());
}

#[tokio::test]
async fn concurrent_batches_over_the_same_keys_insert_each_key_once() {
    let Some((store, _table)) = support::store().await else {
        return;
    };
    let idem = Idempotent::new(store.clone());
    let keys: Vec<String> = (0..64).map(|n| format!("k{n}")).collect();
    let mut batches = tokio::task::JoinSet::new();
    for caller in 0..8 {
        let (store, idem) = (store.clone(), idem.clone());
        // Each caller claims every key, in its own order.
        let mut mine = keys.clone();
        mine.rotate_left(caller * 8);
        batches.spawn(async move {
            let refs: Vec<&str> = mine.iter().map(String::as_str).collect();
            let batch = claims(&idem, &refs);
            let mut conn = store.pool().acquire().await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let inserted = store.claim_many_in(&mut tx, &batch).await.unwrap();
            tx.commit().await.unwrap();
            mine.into_iter()
                .zip(inserted)
                .filter_map(|(key, inserted)| inserted.then_some(key))
                .collect::<Vec<_>>()
        });
    }
    let mut won = Vec::new();
    while let Some(joined) = batches.join_next().await {
        won.extend(joined.unwrap());
    }
    won.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(won, want, "each key claimed by exactly one batch");
}
