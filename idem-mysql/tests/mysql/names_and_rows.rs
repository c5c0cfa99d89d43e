//! Table names are checked once; rows that do not decode and a missing
//! table come back as clear errors through `execute`, never as panics, and
//! the damaged row is left as it was.

use idem_core::store::StoreErrorKind;
use idem_core::{Error, Fingerprint, Idempotent, When};
use idem_mysql::sqlx::mysql::MySqlPoolOptions;
use idem_mysql::{sqlx, MySqlStore};

use crate::support;

fn store_kind<T: std::fmt::Debug>(outcome: Result<T, Error<String>>) -> StoreErrorKind {
    match outcome {
        Err(Error::Store { source, when }) => {
            assert_eq!(when, When::BeforeWork);
            assert_eq!(source.backend_name(), "mysql");
            eprintln!("{source}");
            source.kind()
        }
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// Names that are not plain identifiers are refused before any SQL runs.
#[tokio::test]
async fn table_names_that_are_not_plain_identifiers_are_refused() {
    let pool = MySqlPoolOptions::new()
        .connect_lazy(&support::url())
        .unwrap();
    let long = "t".repeat(65);
    for name in [
        "x; drop table y",
        "",
        "`x`",
        "x'y",
        "a.b.c",
        "a b",
        "1x",
        long.as_str(),
    ] {
        let refused = MySqlStore::from_pool(pool.clone())
            .with_table(name)
            .unwrap_err();
        assert_eq!(refused.kind(), StoreErrorKind::Config, "{name:?}");
        assert!(
            refused.to_string().contains("invalid table name"),
            "{refused}"
        );
    }
    let longest = "t".repeat(64);
    let store = MySqlStore::from_pool(pool).with_table(&longest).unwrap();
    assert_eq!(store.table(), longest);
}

/// A database-qualified, mixed-case, reserved-word table name works as
/// given, and migrating twice is harmless.
#[tokio::test]
async fn database_qualified_and_reserved_names_work() {
    let Some(pool) = support::pool(2).await else {
        return;
    };
    let database = support::unique_name("idem_db");
    sqlx::raw_sql(&format!("CREATE DATABASE {database}"))
        .execute(&pool)
        .await
        .unwrap();
    let _guard = support::DropGuard::database(&database);
    let store = MySqlStore::from_pool(pool.clone())
        .with_table(&format!("{database}.Order"))
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let idem = Idempotent::new(store);
    let ran: u8 = idem
        .execute("k", &(), || async { Ok::<_, String>(1) })
        .await
        .unwrap();
    let replayed: u8 = idem
        .execute("k", &(), || async { Ok::<_, String>(2) })
        .await
        .unwrap();
    assert_eq!((ran, replayed), (1, 1));
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {database}.`Order`"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// A table that was never migrated, or a database that does not exist, is
/// a config error, before the work runs.
#[tokio::test]
async fn a_missing_table_or_database_is_a_config_error() {
    let Some(pool) = support::pool(1).await else {
        return;
    };
    for name in [
        support::unique_name("idem_missing"),
        format!("{}.t", support::unique_name("idem_nodb")),
    ] {
        let store = MySqlStore::from_pool(pool.clone())
            .with_table(&name)
            .unwrap();
        let idem = Idempotent::new(store);
        let outcome = idem
            .execute("k", &(), || async { Ok::<u8, String>(1) })
            .await;
        assert_eq!(store_kind(outcome), StoreErrorKind::Config, "{name}");
    }
}

/// Rows with a short token, a short fingerprint or an unknown state are
/// corrupt errors from every reading method, the claim included; nothing
/// panics, and the row is left exactly as it was.
#[tokio::test]
async fn rows_that_do_not_decode_are_corrupt_errors_and_kept() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let idem = Idempotent::new(store.clone());
    let good_token = vec![7_u8; 16];
    let good_fingerprint = Fingerprint::of_json(&()).unwrap().as_bytes().to_vec();
    let garbage = [
        (
            "short-token",
            vec![1_u8, 2, 3],
            good_fingerprint.clone(),
            1_i8,
        ),
        ("short-fingerprint", good_token.clone(), vec![9_u8; 5], 1),
        ("bad-state", good_token.clone(), good_fingerprint.clone(), 9),
        ("negative-state", good_token, good_fingerprint, -1),
    ];
    for (client_key, token, fingerprint, state) in garbage {
        let key = idem.key(client_key).unwrap();
        sqlx::query(&format!(
            "INSERT INTO {} VALUES (?, ?, ?, ?, 'x', NULL, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
            store.table()
        ))
        .bind(key.as_str())
        .bind(&token)
        .bind(&fingerprint)
        .bind(state)
        .execute(store.pool())
        .await
        .unwrap();
        let outcome = idem
            .execute(client_key, &(), || async { Ok::<u8, String>(1) })
            .await;
        assert_eq!(store_kind(outcome), StoreErrorKind::Corrupt, "{client_key}");
        let loaded = idem_core::store::Store::load(&store, key.as_str())
            .await
            .unwrap_err();
        assert_eq!(loaded.kind(), StoreErrorKind::Corrupt, "{client_key}");
        assert!(loaded.to_string().contains("does not decode"), "{loaded}");
        let kept: (Vec<u8>, Vec<u8>, i8, Vec<u8>) = sqlx::query_as(&format!(
            "SELECT token, fingerprint, state, payload FROM {} WHERE `key` = ?",
            store.table()
        ))
        .bind(key.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(
            kept,
            (token, fingerprint, state, b"x".to_vec()),
            "{client_key}"
        );
    }
}

/// A stored outcome that is valid as a row but not as the caller's type is
/// a decode error, not a wrong replay.
#[tokio::test]
async fn outcomes_of_another_type_are_decode_errors() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let idem = Idempotent::new(store);
    let _: String = idem
        .execute("k", &(), || async { Ok::<_, String>("text".into()) })
        .await
        .unwrap();
    let replay = idem
        .execute("k", &(), || async { Ok::<u64, String>(1) })
        .await;
    assert!(matches!(replay, Err(Error::Decode(_))), "{replay:?}");
}

/// Keys that a text collation would confuse (case, trailing spaces) stay
/// distinct records.
#[tokio::test]
async fn keys_differing_in_case_or_trailing_space_are_distinct() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let idem = Idempotent::new(store.clone());
    for (i, key) in ["Key", "key", "KEY"].into_iter().enumerate() {
        let ran: usize = idem
            .execute(key, &(), || async move { Ok::<_, String>(i) })
            .await
            .unwrap();
        assert_eq!(ran, i, "{key}");
    }
    // Client keys are visible ASCII, so a trailing space reaches a store
    // only through the scope or namespace; the store must keep it.
    let token = idem_core::store::Token::random();
    for key in ["pad", "pad "] {
        let inserted = idem_core::store::Store::insert(
            &store,
            key,
            &crate::in_flight(token, crate::MINUTE, crate::MINUTE),
        )
        .await
        .unwrap();
        assert_eq!(inserted, idem_core::store::Insert::Inserted, "{key:?}");
    }
}
