//! Rows written before fingerprints had schemes (a 32-byte `fingerprint`
//! column) still replay, and a takeover of one keeps that form.

use idem_core::{Error, Fingerprint, Idempotent};
use idem_postgres::sqlx;
use serde_json::json;

use crate::support;

/// SHA-256 of `{"amount":1250}`: the fingerprint every earlier build wrote
/// for that body.
const DIGEST: &str = "9fb40105c56271ac9d6a8da0a6f584dd901d66e4d55081684160a5bc608c7b08";

// Pins compatibility: rows exactly as earlier builds wrote them replay.
#[tokio::test]
async fn rows_written_before_fingerprint_schemes_still_replay() {
    let Some((store, _guard)) = support::store().await else {
        return;
    };
    let table = store.table();
    let insert = |key: &str, state: i16, payload: &str, lease: &str| {
        format!(
            "INSERT INTO {table} (key, token, fingerprint, state, payload, lease_until, retain_until) \
             VALUES ('{key}', decode(repeat('07', 16), 'hex'), decode('{DIGEST}', 'hex'), {state}, \
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
    let idem = Idempotent::new(store.clone());
    let body = json!({"amount": 1250});
    let replayed: Result<String, Error<String>> = idem
        .execute("done", &body, || async { Ok("ran again".to_owned()) })
        .await;
    assert_eq!(replayed.unwrap(), "ch_1");

    // A caller that moved to a newer scheme still matches the old row
    // through the scheme-1 fingerprint it also carries.
    let newer = Fingerprint::of_bytes(b"canonical").with_scheme(2);
    let old = Fingerprint::of_json(&body).unwrap();
    assert_eq!(old.to_string(), DIGEST);
    let begun = idem.begin("done", newer.also_matching(old)).await.unwrap();
    assert!(matches!(begun, idem_core::Begin::Replay(_)), "{begun:?}");
    assert!(matches!(
        idem.begin("done", newer).await,
        Err(Error::Mismatch)
    ));

    // A crashed owner's old row is taken over and rewritten in the same
    // 32-byte form.
    let recovered: Result<String, Error<String>> = idem
        .execute("crashed", &body, || async { Ok("ch_2".to_owned()) })
        .await;
    assert_eq!(recovered.unwrap(), "ch_2");
    let width: i32 = sqlx::query_scalar(&format!(
        "SELECT octet_length(fingerprint) FROM {table} WHERE key = '0:0:crashed'"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(width, 32);
}
