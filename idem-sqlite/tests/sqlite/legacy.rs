//! Rows written before fingerprints had schemes (a 32-byte `fingerprint`
//! blob) still replay, and a takeover of one keeps that form.

use std::time::{SystemTime, UNIX_EPOCH};

use idem_core::Idempotent;
use idem_sqlite::rusqlite::{params, Connection};
use idem_testing::legacy;

use crate::support;

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
    let retain = micros_from_now(3600);
    let rows = [
        ("0:0:done", 1, legacy::PAYLOAD, None, retain),
        (
            "0:0:crashed",
            0,
            &b""[..],
            Some(micros_from_now(-1)),
            retain,
        ),
    ];
    for (key, state, payload, lease, retain) in rows {
        let row = params![
            key,
            [7u8; 16],
            legacy::digest(),
            state,
            payload,
            lease,
            retain
        ];
        db.execute(insert, row).unwrap();
    }
    legacy::check_replays(&Idempotent::new(store), "done", "crashed").await;
    let width: i64 = db
        .query_row(
            "SELECT length(fingerprint) FROM idem_records WHERE key = '0:0:crashed'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(width, 32, "a scheme-1 row is rewritten in the same form");
}
