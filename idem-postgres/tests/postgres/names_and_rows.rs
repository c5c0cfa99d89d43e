//! Table names are checked once; rows that do not decode and a missing
//! table come back as clear errors through `execute`, never as panics.

use idem_core::store::StoreErrorKind;
use idem_core::{Error, Idempotent, When};
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::{sqlx, PostgresStore};

use crate::support;

fn store_kind<T: std::fmt::Debug>(outcome: Result<T, Error<String>>) -> StoreErrorKind {
    match outcome {
        Err(Error::Store { source, when }) => {
            assert_eq!(when, When::BeforeWork);
            assert_eq!(source.backend_name(), "postgres");
            eprintln!("{source}");
            source.kind()
        }
        other => panic!("expected a store error, got {other:?}"),
    }
}

/// Names that are not plain identifiers are refused before any SQL runs.
#[tokio::test]
async fn table_names_that_are_not_plain_identifiers_are_refused() {
    let pool = PgPoolOptions::new().connect_lazy(&support::url()).unwrap();
    let long = "t".repeat(53);
    for name in [
        "x; drop table y",
        "",
        "\"x\"",
        "x'y",
        "a.b.c",
        "a b",
        "1x",
        long.as_str(),
    ] {
        let refused = PostgresStore::from_pool(pool.clone())
            .with_table(name)
            .unwrap_err();
        assert_eq!(refused.kind(), StoreErrorKind::Config, "{name:?}");
        assert!(
            refused.to_string().contains("invalid table name"),
            "{refused}"
        );
    }
    let longest = "t".repeat(52);
    let store = PostgresStore::from_pool(pool).with_table(&longest).unwrap();
    assert_eq!(store.table(), longest);
}

/// A schema-qualified, mixed-case, reserved-word table name works as given.
#[tokio::test]
async fn schema_qualified_and_quoted_names_work() {
    let Some(pool) = support::pool(2).await else {
        return;
    };
    let schema = support::unique_name("idem_schema");
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}"))
        .execute(&pool)
        .await
        .unwrap();
    let _guard = support::drop_guard(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    let store = PostgresStore::from_pool(pool.clone())
        .with_table(&format!("{schema}.Order"))
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
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {schema}.\"Order\""))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// A table that was never migrated is a config error, before the work runs.
#[tokio::test]
async fn a_missing_table_is_a_config_error() {
    let Some(pool) = support::pool(1).await else {
        return;
    };
    let store = PostgresStore::from_pool(pool)
        .with_table(&support::unique_name("idem_missing"))
        .unwrap();
    let idem = Idempotent::new(store);
    let outcome = idem
        .execute("k", &(), || async { Ok::<u8, String>(1) })
        .await;
    assert_eq!(store_kind(outcome), StoreErrorKind::Config);
}

/// Rows with a short token, a short fingerprint or an unknown state are
/// corrupt errors from every reading method; nothing panics.
#[tokio::test]
async fn rows_that_do_not_decode_are_corrupt_errors() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let idem = Idempotent::new(store.clone());
    let good_token = vec![7_u8; 16];
    let good_fingerprint = idem_core::Fingerprint::of_json(&())
        .unwrap()
        .as_bytes()
        .to_vec();
    let garbage = [
        (
            "short-token",
            vec![1_u8, 2, 3],
            good_fingerprint.clone(),
            1_i16,
        ),
        ("short-fingerprint", good_token.clone(), vec![9_u8; 5], 1),
        ("bad-state", good_token.clone(), good_fingerprint.clone(), 9),
        ("negative-state", good_token, good_fingerprint, -1),
    ];
    for (client_key, token, fingerprint, state) in garbage {
        let key = idem.key(client_key).unwrap();
        sqlx::query(&format!(
            "INSERT INTO {} VALUES ($1, $2, $3, $4, 'x', NULL, now() + interval '1 hour')",
            store.table()
        ))
        .bind(key.as_str())
        .bind(token)
        .bind(fingerprint)
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
