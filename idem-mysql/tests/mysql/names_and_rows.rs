//! Table names are checked once; rows that do not decode and a missing
//! table come back as clear errors through `execute`, never as panics, and
//! the damaged row is left as it was.

use idem_core::Idempotent;
use idem_mysql::sqlx;
use idem_mysql::sqlx::mysql::MySqlPoolOptions;
use idem_testing::sql_cases;

use crate::support::{self, My};

/// Names that are not plain identifiers are refused before any SQL runs.
#[tokio::test]
async fn table_names_that_are_not_plain_identifiers_are_refused() {
    let pool = MySqlPoolOptions::new()
        .connect_lazy(&support::url())
        .unwrap();
    sql_cases::table_names_that_are_not_plain_identifiers_are_refused::<My>(pool);
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
    sql_cases::qualified_and_reserved_names_work::<My>(pool, &database).await;
}

/// A table that was never migrated, or a database that does not exist, is
/// a config error, before the work runs.
#[tokio::test]
async fn a_missing_table_or_database_is_a_config_error() {
    let Some(pool) = support::pool(1).await else {
        return;
    };
    let missing = [
        support::unique_name("idem_missing"),
        format!("{}.t", support::unique_name("idem_nodb")),
    ];
    sql_cases::missing_tables_are_config_errors::<My>(pool, &missing).await;
}

/// Rows with a short token, a short fingerprint or an unknown state are
/// corrupt errors from every reading method, the claim included; nothing
/// panics, and the row is left exactly as it was.
#[tokio::test]
async fn rows_that_do_not_decode_are_corrupt_errors_and_kept() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let plant = |key: String, row: sql_cases::BadRow| {
        let store = store.clone();
        async move {
            sqlx::query(&format!(
                "INSERT INTO {} VALUES (?, ?, ?, ?, 'x', NULL, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
                store.table()
            ))
            .bind(key)
            .bind(row.token)
            .bind(row.fingerprint)
            .bind(row.state)
            .execute(store.pool())
            .await
            .unwrap();
        }
    };
    let kept = |key: String, row: sql_cases::BadRow| {
        let store = store.clone();
        async move {
            let kept: (Vec<u8>, Vec<u8>, i8, Vec<u8>) = sqlx::query_as(&format!(
                "SELECT token, fingerprint, state, payload FROM {} WHERE `key` = ?",
                store.table()
            ))
            .bind(key)
            .fetch_one(store.pool())
            .await
            .unwrap();
            let planted = (row.token, row.fingerprint, row.state, b"x".to_vec());
            assert_eq!(kept, planted, "{}", row.client_key);
        }
    };
    sql_cases::rows_that_do_not_decode_are_corrupt_errors::<My, _, _, _, _>(&store, plant, kept)
        .await;
}

/// A stored outcome that is valid as a row but not as the caller's type is
/// a decode error, not a wrong replay.
#[tokio::test]
async fn outcomes_of_another_type_are_decode_errors() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    sql_cases::outcomes_of_another_type_are_decode_errors(store).await;
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
