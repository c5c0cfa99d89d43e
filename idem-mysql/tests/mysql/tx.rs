//! Transactional completion: the conformance kit's transaction cases
//! (business rows and the outcome commit together, a stale owner's writes
//! never land, remembered failures replay, misuse is refused) on a
//! business table of their own, and what only MariaDB needs: a
//! transaction ended behind sqlx's back, and the round trips counted.

use idem_core::store::{State, Store, StoreErrorKind};
use idem_core::{Begin, Error, Fingerprint, Idempotent, Lease};
use idem_mysql::sqlx;
use idem_mysql::MySqlStore;

use crate::support::{self, My};

idem_testing::sql_tx_store! {
    /// A store and a business table of its own, dropped with it.
    struct Charges for My;
    async fn charges();
    create = "CREATE TABLE {charges} (`key` VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL) \
              ENGINE = InnoDB";
    insert = "INSERT INTO {charges} (`key`, amount) VALUES ('{key}', {amount})";
    rows = "SELECT `key` FROM {charges} ORDER BY `key`";
    usurp = "UPDATE `{table}` SET token = REPEAT(X'00', 16)";
    drop_database = "DROP DATABASE IF EXISTS {database}";
    copy_table = |store: &MySqlStore, database: &str| {
        let ours = store.pool().connect_options();
        let ours = ours.get_database().unwrap();
        let table = store.table();
        format!("CREATE TABLE {database}.`{table}` LIKE {ours}.`{table}`")
    };
}

idem_conformance::tx_tests!(charges);

impl Charges {
    async fn lease(&self, idem: &Idempotent, key: &str) -> Lease {
        match idem.begin(key, Fingerprint::of_bytes(b"b")).await.unwrap() {
            Begin::Run(lease) => lease,
            other => panic!("expected to run, got {other:?}"),
        }
    }

    async fn state(&self, idem: &Idempotent, key: &str) -> Option<State> {
        let key = idem.key(key).unwrap();
        let record = self.store.load(key.as_str()).await.unwrap();
        record.map(|r| r.state)
    }
}

/// Regression guard: a raw `COMMIT` inside the work ends the transaction
/// behind sqlx's back; the fence (`@@in_transaction`) refuses to record the
/// outcome in autocommit, with an error that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_ended_behind_sqlx_is_refused() {
    let Some(f) = charges().await else {
        return;
    };
    let idem = Idempotent::new(f.store.clone());
    let lease = f.lease(&idem, "k").await;
    let mut tx = f.store.pool().begin().await.unwrap();
    sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await.unwrap();
    match f.store.complete_in(&mut tx, lease.clone(), b"1").await {
        Err(Error::Store { source, .. }) => {
            assert_eq!(source.kind(), StoreErrorKind::Config, "{source}");
            assert!(
                source.to_string().contains("no transaction open"),
                "{source}"
            );
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    drop(tx);
    assert_eq!(f.state(&idem, "k").await, Some(State::InFlight));

    let sql = idem_conformance::tx::TxStore::insert(&f, "c", 1);
    let committed: Result<i64, Error<sqlx::Error>> = f
        .store
        .execute_in_tx(&idem, "c", "body", move |tx| {
            Box::pin(async move {
                sqlx::query(&sql).execute(&mut *tx).await?;
                sqlx::query("COMMIT").execute(&mut *tx).await?;
                Ok(1)
            })
        })
        .await;
    match committed {
        Err(Error::Store { source, .. }) => {
            assert_eq!(source.kind(), StoreErrorKind::Config, "{source}")
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    assert_ne!(f.state(&idem, "c").await, Some(State::Completed));
}

/// The round trips of a transactional first execution, counted by the
/// server: claim, BEGIN, the business insert, the fenced update, COMMIT —
/// the raw protocol's own statements, none added; a replay is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_first_execution_adds_no_round_trip() {
    let Some(f) = charges().await else {
        return;
    };
    // One connection, so the session's own counters see every statement.
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&support::url())
        .await
        .unwrap();
    let store = MySqlStore::from_pool(pool.clone())
        .with_table(&f.store.table())
        .unwrap();
    let idem = Idempotent::new(store.clone());
    let questions = || async {
        let row: (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Questions'")
            .fetch_one(&pool)
            .await
            .unwrap();
        row.1.parse::<i64>().unwrap()
    };
    let charge = |key: &'static str| {
        let sql = idem_conformance::tx::TxStore::insert(&f, key, 1);
        let (store, idem) = (store.clone(), idem.clone());
        async move {
            store
                .execute_in_tx(&idem, key, &1, move |tx| {
                    Box::pin(async move {
                        sqlx::query(&sql).execute(&mut *tx).await?;
                        Ok::<_, sqlx::Error>(1)
                    })
                })
                .await
                .unwrap()
        }
    };
    // Warm the statement cache, so preparing is not counted.
    charge("warm").await;
    let before = questions().await;
    charge("first").await;
    let first = questions().await - before - 1;
    let before = questions().await;
    charge("first").await;
    let replay = questions().await - before - 1;
    // Questions counts each executed statement (prepared or text), not
    // the PREPARE itself once cached.
    assert_eq!((first, replay), (5, 1), "first, replay");
}
