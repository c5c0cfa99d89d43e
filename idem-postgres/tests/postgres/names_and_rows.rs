//! Table names are checked once; rows that do not decode and a missing
//! table come back as clear errors through `execute`, never as panics.

use idem_postgres::sqlx;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_testing::sql_cases;

use crate::support::{self, Pg};

/// Names that are not plain identifiers are refused before any SQL runs.
#[tokio::test]
async fn table_names_that_are_not_plain_identifiers_are_refused() {
    let pool = PgPoolOptions::new().connect_lazy(&support::url()).unwrap();
    sql_cases::table_names_that_are_not_plain_identifiers_are_refused::<Pg>(pool);
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
    sql_cases::qualified_and_reserved_names_work::<Pg>(pool, &schema).await;
}

/// A table that was never migrated is a config error, before the work runs.
#[tokio::test]
async fn a_missing_table_is_a_config_error() {
    let Some(pool) = support::pool(1).await else {
        return;
    };
    let missing = [support::unique_name("idem_missing")];
    sql_cases::missing_tables_are_config_errors::<Pg>(pool, &missing).await;
}

/// Rows with a short token, a short fingerprint or an unknown state are
/// corrupt errors from every reading method; nothing panics.
#[tokio::test]
async fn rows_that_do_not_decode_are_corrupt_errors() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let plant = |key: String, row: sql_cases::BadRow| {
        let store = store.clone();
        async move {
            sqlx::query(&format!(
                "INSERT INTO {} VALUES ($1, $2, $3, $4, 'x', NULL, now() + interval '1 hour')",
                store.table()
            ))
            .bind(key)
            .bind(row.token)
            .bind(row.fingerprint)
            .bind(i16::from(row.state))
            .execute(store.pool())
            .await
            .unwrap();
        }
    };
    let kept = |_, _| async {};
    sql_cases::rows_that_do_not_decode_are_corrupt_errors::<Pg, _, _, _, _>(&store, plant, kept)
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
