//! The emulator the tests run against: moto in server mode
//! (`dev/moto/start`), at `IDEM_DYNAMODB_ENDPOINT` or 127.0.0.1:5000.

#![allow(dead_code)]

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use idem_dynamodb::{Credentials, DynamoStore};
use idem_testing::{unique_name, Cleanup};
use serde_json::json;

pub(crate) const REGION: &str = "us-east-1";

pub(crate) fn endpoint() -> String {
    std::env::var("IDEM_DYNAMODB_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:5000".to_owned())
}

/// Whether the emulator's port answers.
pub(crate) fn reachable() -> bool {
    let endpoint = endpoint();
    let authority = endpoint
        .split("://")
        .nth(1)
        .unwrap_or(&endpoint)
        .trim_end_matches('/');
    authority
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok())
}

/// Skips the whole binary (fails it under `CI`) when moto is not running.
pub(crate) fn require_for_binary() {
    if !reachable() {
        idem_testing::skip_binary(&format!(
            "no DynamoDB emulator answers at {} (start one with dev/moto/start, or set IDEM_DYNAMODB_ENDPOINT)",
            endpoint()
        ));
    }
}

/// The emulator ignores credentials; any pair signs.
pub(crate) fn credentials() -> Credentials {
    Credentials::new("idem-test", "idem-test-secret", None)
}

pub(crate) fn store_on(table: &str) -> DynamoStore {
    DynamoStore::from_client(
        reqwest::Client::new(),
        table,
        REGION,
        Some(&endpoint()),
        credentials(),
    )
    .expect("a valid store")
}

/// A store on a new table of its own, and a guard that deletes the table.
pub(crate) async fn fresh_store() -> (DynamoStore, Cleanup) {
    let table = unique_name("idem_test");
    let store = store_on(&table);
    store
        .create_table()
        .await
        .unwrap_or_else(|e| panic!("cannot create table {table}: {e}"));
    let guard = Cleanup::new(format!("delete table {table}"), move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(store_on(&table).delete_table())?;
        Ok(())
    });
    (store, guard)
}

/// How many records (not payload parts) the table holds, expired or not.
pub(crate) async fn stored_records(store: &DynamoStore) -> usize {
    let mut count = 0;
    let mut start = None;
    loop {
        let mut body = json!({
            "TableName": store.table(),
            "ConsistentRead": true,
            "Select": "COUNT",
            "FilterExpression": "attribute_exists(st)",
        });
        if let Some(start) = start.take() {
            body["ExclusiveStartKey"] = start;
        }
        let page = store
            .request("Scan", body)
            .await
            .unwrap_or_else(|e| panic!("cannot count the items of {}: {e}", store.table()));
        count += page["Count"].as_u64().expect("a count") as usize;
        match page.get("LastEvaluatedKey") {
            Some(next) if !next.is_null() => start = Some(next.clone()),
            _ => return count,
        }
    }
}
