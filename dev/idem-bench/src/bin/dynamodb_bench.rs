//! idem's DynamoDB store against raw `PutItem`/`GetItem` calls on the same
//! emulator, in one run: ratios only, since an emulator's absolute times
//! say nothing of DynamoDB's.
//!
//! `cargo run --release -p idem-bench --bin dynamodb-bench -- [--quick] [--ops N]`
//!
//! Needs moto at `IDEM_DYNAMODB_ENDPOINT` or 127.0.0.1:5000
//! (`dev/moto/start`). Each repetition runs, on fresh keys of a new table:
//! - first execution: idem's `execute` (a conditional claim, then the
//!   completion) against the raw minimal protocol (a `PutItem` on
//!   `attribute_not_exists(pk)`, then a `PutItem` of the outcome);
//! - replay: idem's `execute` on the same keys (one conditional `PutItem`
//!   that fails and returns the record) against a raw `GetItem`.
//!
//! Both sides sign and send through the same client code
//! ([`DynamoStore::request`] for the raw side). Calls run one at a time:
//! moto serves them one at a time anyway. The raw side goes first in even
//! repetitions, last in odd ones; each ratio is the median over them.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use idem_core::Idempotent;
use idem_dynamodb::{Credentials, DynamoStore};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let ops: usize = match args.iter().position(|a| a == "--ops") {
        Some(at) => args.get(at + 1).ok_or("--ops takes a number")?.parse()?,
        None if quick => 50,
        None => 500,
    };
    let repetitions = if quick { 2 } else { 5 };
    let endpoint = std::env::var("IDEM_DYNAMODB_ENDPOINT")
        .unwrap_or_else(|_| "http://127.0.0.1:5000".to_owned());

    let (mut first, mut replay) = (Vec::new(), Vec::new());
    for repetition in 0..repetitions {
        let table = idem_testing::unique_name("idem_bench");
        let store = DynamoStore::from_client(
            reqwest::Client::new(),
            &table,
            "us-east-1",
            Some(&endpoint),
            Credentials::new("idem-bench", "idem-bench-secret", None),
        )?;
        store
            .create_table()
            .await
            .map_err(|e| format!("no DynamoDB emulator at {endpoint} (dev/moto/start): {e}"))?;
        let idem = Idempotent::new(store.clone());
        let raw_first_first = repetition % 2 == 0;
        let mut times = [Duration::ZERO; 4];
        for side in [raw_first_first, !raw_first_first] {
            if side {
                times[0] = raw_first(&store, ops).await?;
                times[1] = raw_replay(&store, ops).await?;
            } else {
                times[2] = idem_run(&idem, ops).await?;
                times[3] = idem_run(&idem, ops).await?;
            }
        }
        first.push(times[2].as_secs_f64() / times[0].as_secs_f64());
        replay.push(times[3].as_secs_f64() / times[1].as_secs_f64());
        store.delete_table().await?;
    }
    println!("DynamoDB store on moto, {ops} keys, {repetitions} repetitions, idem / raw (median):");
    println!(
        "  first execution (claim + complete): {:.2}",
        median(&mut first)
    );
    println!(
        "  replay (one call each):             {:.2}",
        median(&mut replay)
    );
    Ok(())
}

async fn raw_first(store: &DynamoStore, ops: usize) -> Result<Duration, BoxError> {
    let started = Instant::now();
    for i in 0..ops {
        let pk = json!({ "S": format!("raw-{i}") });
        store
            .request(
                "PutItem",
                json!({
                    "TableName": store.table(),
                    "Item": { "pk": pk, "st": { "N": "0" } },
                    "ConditionExpression": "attribute_not_exists(pk)",
                }),
            )
            .await?;
        store
            .request(
                "PutItem",
                json!({
                    "TableName": store.table(),
                    "Item": { "pk": pk, "st": { "N": "1" }, "pl": { "B": "Nw==" } },
                }),
            )
            .await?;
    }
    Ok(started.elapsed())
}

async fn raw_replay(store: &DynamoStore, ops: usize) -> Result<Duration, BoxError> {
    let started = Instant::now();
    for i in 0..ops {
        let got = store
            .request(
                "GetItem",
                json!({
                    "TableName": store.table(),
                    "Key": { "pk": { "S": format!("raw-{i}") } },
                    "ConsistentRead": true,
                }),
            )
            .await?;
        if got.get("Item").is_none() {
            return Err(format!("raw key {i} is missing").into());
        }
    }
    Ok(started.elapsed())
}

async fn idem_run(idem: &Idempotent, ops: usize) -> Result<Duration, BoxError> {
    let started = Instant::now();
    for i in 0..ops {
        let value: u32 = idem
            .execute(&format!("idem-{i}"), "body", || async {
                Ok::<_, BoxError>(7)
            })
            .await?;
        if value != 7 {
            return Err(format!("key {i} answered {value}").into());
        }
    }
    Ok(started.elapsed())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
