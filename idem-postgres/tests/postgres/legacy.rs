//! Rows written before fingerprints had schemes (a 32-byte `fingerprint`
//! column) still replay, and a takeover of one keeps that form.

use idem_core::Idempotent;
use idem_postgres::sqlx;
use idem_testing::legacy;

use crate::support;

// Pins compatibility: rows exactly as earlier builds wrote them replay.
#[tokio::test]
async fn rows_written_before_fingerprint_schemes_still_replay() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let table = store.table();
    let digest = legacy::DIGEST_HEX;
    let insert = |key: &str, state: i16, payload: &str, lease: &str| {
        format!(
            "INSERT INTO {table} (key, token, fingerprint, state, payload, lease_until, retain_until) \
             VALUES ('{key}', decode(repeat('07', 16), 'hex'), decode('{digest}', 'hex'), {state}, \
             convert_to('{payload}', 'UTF8'), {lease}, now() + interval '1 hour')"
        )
    };
    for statement in [
        insert("0:0:done", 1, "\"ch_1\"", "NULL"),
        insert("0:0:crashed", 0, "", "now() - interval '1 second'"),
    ] {
        sqlx::raw_sql(&statement)
            .execute(store.pool())
            .await
            .unwrap();
    }
    legacy::check_replays(&Idempotent::new(store.clone()), "done", "crashed").await;
    let width: i32 = sqlx::query_scalar(&format!(
        "SELECT octet_length(fingerprint) FROM {table} WHERE key = '0:0:crashed'"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(width, 32, "a scheme-1 row is rewritten in the same form");
}
