//! Deleting records past retention: a scan, then one conditional delete
//! per lapsed item. DynamoDB's TTL deletes them too, within days; the purge
//! is for tables without TTL and for tests that count items.

use idem_core::store::StoreError;
use serde_json::{json, Value};

use crate::item::n;
use crate::store::DynamoStore;

/// Deletes up to `limit` records past retention and returns how many. A
/// payload part past its retention is deleted too but not counted: it is
/// part of a record, not one.
pub(crate) async fn purge(store: &DynamoStore, limit: usize) -> Result<usize, StoreError> {
    let mut deleted = 0;
    let mut start: Option<Value> = None;
    while deleted < limit {
        let page = store
            .client()
            .call("Scan", |now| {
                let mut body = json!({
                    "TableName": store.table(),
                    "ConsistentRead": true,
                    "ProjectionExpression": "pk, st",
                    "FilterExpression": "rt <= :now",
                    "ExpressionAttributeValues": { ":now": n(now) },
                });
                if let Some(start) = &start {
                    body["ExclusiveStartKey"] = start.clone();
                }
                body
            })
            .await?;
        for item in page["Items"].as_array().into_iter().flatten() {
            if deleted == limit {
                break;
            }
            let gone = store
                .client()
                .call("DeleteItem", |now| {
                    json!({
                        "TableName": store.table(),
                        "Key": { "pk": item["pk"].clone() },
                        "ConditionExpression": "rt <= :now",
                        "ExpressionAttributeValues": { ":now": n(now) },
                    })
                })
                .await;
            match gone {
                Ok(_) if item.get("st").is_some() => deleted += 1,
                Ok(_) => {}
                // Written again since the scan: live, not ours to delete.
                Err(error) if error.condition_failed() => {}
                Err(error) => return Err(error.into()),
            }
        }
        match page.get("LastEvaluatedKey") {
            Some(next) if !next.is_null() => start = Some(next.clone()),
            _ => break,
        }
    }
    Ok(deleted)
}
