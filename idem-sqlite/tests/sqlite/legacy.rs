//! Rows written before fingerprints had schemes (a 32-byte `fingerprint`
//! blob) still replay, and a takeover of one keeps that form.

use std::time::{SystemTime, UNIX_EPOCH};

use idem_core::{Begin, Error, Fingerprint, Idempotent};
use idem_sqlite::rusqlite::{params, Connection};
use serde_json::json;

use crate::support;

/// SHA-256 of `{"amount":1250}`: the fingerprint every earlier build wrote
/// for that body.
const DIGEST: &str = "9fb40105c56271ac9d6a8da0a6f584dd901d66e4d55081684160a5bc608c7b08";

fn digest() -> Vec<u8> {
    (0..32)
        .map(|i| u8::from_str_radix(&DIGEST[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn micros_from_now(seconds: i64) -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(now.as_micros()).unwrap() + seconds * 1_000_000
}

// Pins compatibility: rows exactly as earlier builds wrote them replay.
#[tokio::test]
async fn rows_written_before_fingerprint_schemes_still_replay() {
    let (store, _dir, path) = support::fresh().await;
    let db = Connection::open(&path).unwrap();
    let insert = "INSERT INTO idem_records \
        (key, token, fingerprint, state, payload, lease_until, retain_until) \
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
    db.execute(
        insert,
        params![
            "0:0:done",
            [7u8; 16],
            digest(),
            1,
            b"\"ch_1\"",
            None::<i64>,
            micros_from_now(3600)
        ],
    )
    .unwrap();
    db.execute(
        insert,
        params![
            "0:0:crashed",
            [7u8; 16],
            digest(),
            0,
            b"",
            micros_from_now(-1),
            micros_from_now(3600)
        ],
    )
    .unwrap();

    let idem = Idempotent::new(store);
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
    assert!(matches!(begun, Begin::Replay(_)), "{begun:?}");
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
    let width: i64 = db
        .query_row(
            "SELECT length(fingerprint) FROM idem_records WHERE key = '0:0:crashed'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(width, 32);
}
