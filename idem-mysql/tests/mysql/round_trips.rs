//! Round trips counted by the server itself: the session status counters of
//! the one connection the store under test runs on. Every store call is one
//! prepared statement, so `Com_stmt_execute` counts the round trips.

use idem_core::{Error, Fingerprint, Idempotent};
use idem_mysql::sqlx;
use idem_mysql::sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::support;

/// Session counters, read over the text protocol on the store's own
/// connection: a `SHOW` sent that way bumps `Com_show_status` and none of
/// the counters read here.
async fn counters(pool: &MySqlPool) -> [i64; 3] {
    let rows = sqlx::raw_sql(
        "SHOW SESSION STATUS WHERE Variable_name IN \
         ('Com_stmt_execute', 'Com_stmt_prepare', 'Handler_update', 'Handler_delete')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut found = [0_i64; 3];
    for row in rows {
        let name: String = row.try_get(0).unwrap();
        let value: String = row.try_get(1).unwrap();
        let value: i64 = value.parse().unwrap();
        match name.as_str() {
            "Com_stmt_execute" => found[0] += value,
            "Com_stmt_prepare" => found[1] += value,
            // Rows changed or deleted. Not `Handler_write`: the claim's
            // insert attempt counts there even when it meets a duplicate.
            _ => found[2] += value,
        }
    }
    found
}

async fn during<F: std::future::Future<Output = ()>>(pool: &MySqlPool, run: F) -> [i64; 3] {
    let before = counters(pool).await;
    run.await;
    let after = counters(pool).await;
    [0, 1, 2].map(|i| after[i] - before[i])
}

/// First execution 2 statements, replay 1, in progress 1, mismatch 1; and
/// replays, in-progress answers and mismatches change no row.
#[tokio::test]
async fn each_outcome_costs_the_designed_number_of_statements() {
    // One connection, so the session counters see every statement.
    let Some(pool) = support::pool(1).await else {
        return;
    };
    let (store, _guard) = support::store_in(pool.clone()).await;
    let idem = Idempotent::new(store.clone());
    let run = |key: String, body: u32| {
        let idem = idem.clone();
        async move {
            idem.execute(&key, &body, || async { Ok::<_, String>(body) })
                .await
        }
    };

    // Warm every prepared statement into the connection's cache: the first
    // use of a statement on a connection costs a prepare round trip.
    run("warm".into(), 1).await.unwrap();
    run("warm".into(), 1).await.unwrap();
    let held = idem
        .begin("held", Fingerprint::of_json(&1).unwrap())
        .await
        .unwrap();

    const TIMES: i64 = 3;
    let first = during(&pool, async {
        for i in 0..TIMES {
            assert_eq!(run(format!("k{i}"), 1).await.unwrap(), 1);
        }
    })
    .await;
    let replay = during(&pool, async {
        for i in 0..TIMES {
            assert_eq!(run(format!("k{i}"), 1).await.unwrap(), 1);
        }
    })
    .await;
    let in_progress = during(&pool, async {
        for _ in 0..TIMES {
            let busy = run("held".into(), 1).await;
            assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
        }
    })
    .await;
    let mismatch = during(&pool, async {
        for i in 0..TIMES {
            let other = run(format!("k{i}"), 2).await;
            assert!(matches!(other, Err(Error::Mismatch)), "{other:?}");
        }
    })
    .await;
    drop(held);
    let per_call = |counts: [i64; 3]| counts[0] as f64 / TIMES as f64;
    eprintln!(
        "statements per call: first {} replay {} in-progress {} mismatch {}",
        per_call(first),
        per_call(replay),
        per_call(in_progress),
        per_call(mismatch),
    );
    assert_eq!(
        [first[0], replay[0], in_progress[0], mismatch[0]],
        [2 * TIMES, TIMES, TIMES, TIMES],
        "statements executed for first execution, replay, in progress, mismatch"
    );
    assert_eq!(
        [first[1], replay[1], in_progress[1], mismatch[1]],
        [0; 4],
        "statements prepared again"
    );
    assert!(first[2] >= TIMES, "a completion changes a row: {first:?}");
    assert_eq!(
        [replay[2], in_progress[2], mismatch[2]],
        [0; 3],
        "rows changed by replays, in-progress answers and mismatches"
    );
}
