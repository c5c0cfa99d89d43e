//! The store: one conditional write per primitive, consistent reads.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError};
use serde_json::{json, Map, Value};

use crate::client::Client;
use crate::error::{corrupt, DynamoError};
use crate::item::{self, b, n, s, Stored};
use crate::sigv4::Credentials;
use crate::BACKEND;

const LIVE_OWNED: &str = "rt > :now AND st = :inflight AND tk = :tk";

/// An idem store on a DynamoDB table: one item per record, every
/// primitive one conditional `PutItem` or `DeleteItem`, reads strongly
/// consistent.
///
/// See the [crate docs](crate) for the item layout, the clock and the
/// table's settings.
#[derive(Clone)]
pub struct DynamoStore {
    client: Arc<Client>,
    table: String,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .field("region", &self.client.region)
            .field("endpoint", &self.client.endpoint.as_str())
            .field("credentials", &self.client.credentials)
            .finish()
    }
}

impl DynamoStore {
    /// Opens the store a `dynamodb://TABLE?region=REGION&endpoint=URL` URL
    /// names, with credentials from the environment
    /// ([`Credentials::from_env`]), and checks that the table exists.
    ///
    /// `region` defaults to `AWS_REGION`, then `AWS_DEFAULT_REGION`;
    /// `endpoint` to DynamoDB's own in that region (give it for a local
    /// emulator or a VPC endpoint). The check also sets the store's clock
    /// from the service's (see the crate docs, *Deadlines and clocks*).
    pub async fn connect(url: &str) -> Result<DynamoStore, StoreError> {
        let store = DynamoStore::from_url(url)?;
        store.check().await?;
        Ok(store)
    }

    /// The store a URL names, as [`connect`](Self::connect) reads it,
    /// without a call yet: for a caller that names another table
    /// ([`with_table`](Self::with_table)) or creates it
    /// ([`create_table`](Self::create_table)) before its first call.
    pub fn from_url(url: &str) -> Result<DynamoStore, StoreError> {
        let (table, region, endpoint) = parse_url(url)?;
        let credentials = Credentials::from_env().ok_or_else(|| {
            StoreError::config(
                BACKEND,
                "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                 (and AWS_SESSION_TOKEN for temporary ones)",
            )
        })?;
        DynamoStore::from_client(
            default_http()?,
            &table,
            &region,
            endpoint.as_deref(),
            credentials,
        )
    }

    /// A store on `table` over an HTTP client of your own, without a call
    /// yet. `endpoint` `None` is DynamoDB's own in `region`.
    pub fn from_client(
        http: reqwest::Client,
        table: &str,
        region: &str,
        endpoint: Option<&str>,
        credentials: Credentials,
    ) -> Result<DynamoStore, StoreError> {
        check_table(table)?;
        if region.is_empty() {
            return Err(StoreError::config(BACKEND, "the region is empty"));
        }
        let endpoint = endpoint
            .map(str::to_owned)
            .unwrap_or_else(|| format!("https://dynamodb.{region}.amazonaws.com"));
        let endpoint = reqwest::Url::parse(&endpoint).map_err(|e| {
            StoreError::config(
                BACKEND,
                format!("the endpoint {endpoint:?} is not a URL: {e}"),
            )
        })?;
        let client = Client::new(http, endpoint, region.to_owned(), credentials)?;
        Ok(DynamoStore {
            client: Arc::new(client),
            table: table.to_owned(),
        })
    }

    /// The same store, retrying a throttled call up to `retries` times
    /// (default 4) with jittered backoff from 25 ms to 800 ms; past them
    /// the call fails with a `Backend` error.
    pub fn with_retries(self, retries: u32) -> DynamoStore {
        self.client
            .retries
            .store(retries, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The same store, following the service's clock once this machine's
    /// is off it by more than `allowance` (default 1 s).
    pub fn with_skew_allowance(self, allowance: Duration) -> DynamoStore {
        self.client.clock.set_allowance(allowance);
        self
    }

    /// The same store on another table of the same account and region.
    pub fn with_table(self, table: &str) -> Result<DynamoStore, StoreError> {
        check_table(table)?;
        Ok(DynamoStore {
            client: self.client,
            table: table.to_owned(),
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// How far, in milliseconds, the store's clock is set from this
    /// machine's: zero while they agree within the allowance.
    pub fn clock_offset_ms(&self) -> i64 {
        self.client.clock.offset()
    }

    /// Checks that the table exists and learns the service's clock.
    pub async fn check(&self) -> Result<(), StoreError> {
        self.request("DescribeTable", json!({ "TableName": self.table }))
            .await
            .map(drop)
    }

    /// Creates the table if it does not exist, on-demand billing, and turns
    /// on DynamoDB's TTL on `ttl` if it is off; waits until the table is
    /// active. What the SQL stores' `migrate()` is. On a table that is
    /// ready it only reads (`DescribeTable`, `DescribeTimeToLive`), so it
    /// needs no write permission on the table's settings. A table made
    /// another way needs the partition key `pk` (string) and TTL on `ttl`.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let table = json!({ "TableName": self.table });
        match self.client.call("DescribeTable", |_| table.clone()).await {
            Ok(_) => {}
            Err(DynamoError::Service { kind, .. }) if kind == "ResourceNotFoundException" => {
                let created = self
                    .client
                    .call("CreateTable", |_| {
                        json!({
                            "TableName": self.table,
                            "AttributeDefinitions": [{ "AttributeName": "pk", "AttributeType": "S" }],
                            "KeySchema": [{ "AttributeName": "pk", "KeyType": "HASH" }],
                            "BillingMode": "PAY_PER_REQUEST",
                        })
                    })
                    .await;
                match created {
                    // Another process created it meanwhile.
                    Err(DynamoError::Service { kind, .. }) if kind == "ResourceInUseException" => {}
                    other => {
                        other?;
                    }
                }
            }
            Err(error) => return Err(error.into()),
        }
        for _ in 0..240 {
            let described = self.request("DescribeTable", table.clone()).await?;
            if described["Table"]["TableStatus"] == "ACTIVE" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let ttl = self.request("DescribeTimeToLive", table.clone()).await?;
        let status = &ttl["TimeToLiveDescription"]["TimeToLiveStatus"];
        if status == "ENABLED" || status == "ENABLING" {
            return Ok(());
        }
        self.request(
            "UpdateTimeToLive",
            json!({
                "TableName": self.table,
                "TimeToLiveSpecification": { "Enabled": true, "AttributeName": "ttl" },
            }),
        )
        .await
        .map(drop)
    }

    /// Deletes the table and every record in it.
    pub async fn delete_table(&self) -> Result<(), StoreError> {
        self.request("DeleteTable", json!({ "TableName": self.table }))
            .await
            .map(drop)
    }

    /// Sends one signed call to DynamoDB's JSON API (`operation` such as
    /// `GetItem`, `body` its request) and returns the reply: for tools and
    /// benchmarks that need the raw API beside the store.
    pub async fn request(&self, operation: &str, body: Value) -> Result<Value, StoreError> {
        Ok(self.client.call(operation, |_| body.clone()).await?)
    }

    fn key(&self, key: &str) -> Value {
        json!({ "pk": s(key) })
    }

    /// Writes `record` under `key` on `condition`; `Ok(None)` when it was
    /// written, the item the condition found otherwise (`Value::Null` when
    /// there was none).
    async fn put(
        &self,
        key: &str,
        record: &NewRecord<'_>,
        condition: &str,
        token: Option<&[u8; 16]>,
    ) -> Result<Option<(Value, i64)>, StoreError> {
        let wid: [u8; 16] = rand::random();
        let parts = item::encode_parts(key, record, self.client.clock.now_ms(), &wid);
        for part in &parts {
            self.client
                .call(
                    "PutItem",
                    |_| json!({ "TableName": self.table, "Item": part }),
                )
                .await?;
        }
        let seen = std::sync::Mutex::new(0i64);
        let result = self
            .client
            .call("PutItem", |now| {
                *seen.lock().expect("never poisoned") = now;
                let mut values = Map::new();
                values.insert(":now".into(), n(now));
                if let Some(token) = token {
                    values.insert(":tk".into(), b(token));
                    values.insert(":inflight".into(), n(0));
                }
                json!({
                    "TableName": self.table,
                    "Item": item::encode(key, record, now, &wid),
                    "ConditionExpression": condition,
                    "ExpressionAttributeValues": values,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                })
            })
            .await;
        let now = *seen.lock().expect("never poisoned");
        match result {
            Ok(_) => Ok(None),
            Err(error) if error.condition_failed() => {
                self.forget_parts(key, &wid, parts.len()).await;
                Ok(Some((failed_item(error), now)))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Deletes parts no record names (best effort: left over, they lapse
    /// with their retention).
    async fn forget_parts(&self, key: &str, wid: &[u8; 16], count: usize) {
        for index in 0..count {
            let deleted = self
                .request(
                    "DeleteItem",
                    json!({ "TableName": self.table, "Key": self.key(&item::part_key(key, wid, index)) }),
                )
                .await;
            if let Err(error) = deleted {
                tracing::debug!(%error, "an unused payload part is left to lapse");
                return;
            }
        }
    }

    /// The record in `item` read at `now`, its parts read back, or `None`
    /// when it is past retention.
    async fn live(&self, key: &str, item: &Value, now: i64) -> Result<Option<Record>, StoreError> {
        if item.is_null() || item.as_object().is_some_and(Map::is_empty) {
            return Ok(None);
        }
        let Stored {
            mut record,
            retention_ms,
            parts,
        } = item::decode(key, item, now)?;
        if retention_ms <= now {
            return Ok(None);
        }
        if let Some((count, wid, len)) = parts {
            record.payload = self.read_parts(key, &wid, count, len).await?;
        }
        Ok(Some(record))
    }

    async fn read_parts(
        &self,
        key: &str,
        wid: &[u8; 16],
        count: usize,
        len: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let mut payload = Vec::with_capacity(len);
        for index in 0..count {
            let part_key = item::part_key(key, wid, index);
            let got = self
                .request(
                    "GetItem",
                    json!({ "TableName": self.table, "Key": self.key(&part_key), "ConsistentRead": true }),
                )
                .await?;
            let part = got.get("Item").ok_or_else(|| {
                corrupt(key, format!("payload part {index} of {count} is missing"))
            })?;
            payload.extend(item::bytes(key, part, "pt")?);
        }
        if payload.len() != len {
            return Err(corrupt(
                key,
                format!("payload parts hold {} bytes, not {len}", payload.len()),
            ));
        }
        Ok(payload)
    }

    /// Deletes the item under `key` on `condition`; the old item when it
    /// did, or the item the condition found (`Value::Null` for none).
    async fn delete(
        &self,
        key: &str,
        condition: &str,
        token: Option<&[u8; 16]>,
    ) -> Result<(bool, Value, i64), StoreError> {
        let seen = std::sync::Mutex::new(0i64);
        let result = self
            .client
            .call("DeleteItem", |now| {
                *seen.lock().expect("never poisoned") = now;
                let mut values = Map::new();
                values.insert(":now".into(), n(now));
                values.insert(":inflight".into(), n(0));
                if let Some(token) = token {
                    values.insert(":tk".into(), b(token));
                }
                json!({
                    "TableName": self.table,
                    "Key": self.key(key),
                    "ConditionExpression": condition,
                    "ExpressionAttributeValues": values,
                    "ReturnValues": "ALL_OLD",
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                })
            })
            .await;
        let now = *seen.lock().expect("never poisoned");
        match result {
            Ok(reply) => Ok((
                true,
                reply.get("Attributes").cloned().unwrap_or(Value::Null),
                now,
            )),
            Err(error) if error.condition_failed() => Ok((false, failed_item(error), now)),
            Err(error) => Err(error.into()),
        }
    }
}

/// The item a failed condition found.
fn failed_item(error: DynamoError) -> Value {
    match error {
        DynamoError::Service { item, .. } => item.unwrap_or(Value::Null),
        _ => Value::Null,
    }
}

#[async_trait]
impl Store for DynamoStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let found = self
            .put(key, record, "attribute_not_exists(pk) OR rt <= :now", None)
            .await?;
        let Some((item, now)) = found else {
            return Ok(Insert::Inserted);
        };
        match self.live(key, &item, now).await? {
            Some(record) => Ok(Insert::Found(record)),
            // The condition failed on a live record; the reply did not
            // carry it (an emulator's gap): read it.
            None => match self.load(key).await? {
                Some(record) => Ok(Insert::Found(record)),
                None => Err(StoreError::backend(
                    BACKEND,
                    "a claim's condition failed, yet no live record is there",
                )),
            },
        }
    }

    async fn swap(
        &self,
        key: &str,
        expected: idem_core::store::Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let found = self
            .put(key, record, LIVE_OWNED, Some(expected.as_bytes()))
            .await?;
        Ok(found.is_none())
    }

    async fn take_over(
        &self,
        key: &str,
        expected: idem_core::store::Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let condition = format!("{LIVE_OWNED} AND ls <= :now");
        let found = self
            .put(key, record, &condition, Some(expected.as_bytes()))
            .await?;
        Ok(found.is_none())
    }

    async fn remove(
        &self,
        key: &str,
        expected: idem_core::store::Token,
    ) -> Result<bool, StoreError> {
        let (deleted, _, _) = self
            .delete(key, LIVE_OWNED, Some(expected.as_bytes()))
            .await?;
        Ok(deleted)
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let seen = std::sync::Mutex::new(0i64);
        let got = self
            .client
            .call("GetItem", |now| {
                *seen.lock().expect("never poisoned") = now;
                json!({ "TableName": self.table, "Key": self.key(key), "ConsistentRead": true })
            })
            .await?;
        let now = *seen.lock().expect("never poisoned");
        self.live(key, got.get("Item").unwrap_or(&Value::Null), now)
            .await
    }

    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        let (deleted, item, now) = self
            .delete(key, "rt > :now AND st <> :inflight", None)
            .await?;
        if item.is_null() {
            return Ok(Reset::Absent);
        }
        let stored = item::decode(key, &item, now)?;
        Ok(match (deleted, stored.record.state) {
            (true, state) => Reset::Deleted(state),
            (false, _) if !stored.is_live(now) => Reset::Absent,
            (false, State::InFlight) => Reset::InFlight,
            // A settled live record fails no condition on the same clock.
            (false, _) => Reset::Absent,
        })
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        crate::purge::purge(self, limit).await
    }
}

impl DynamoStore {
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }
}

fn default_http() -> Result<reqwest::Client, StoreError> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| StoreError::config(BACKEND, e))
}

/// `dynamodb://TABLE?region=REGION&endpoint=URL` into its parts.
pub(crate) fn parse_url(url: &str) -> Result<(String, String, Option<String>), StoreError> {
    let bad = |why: &str| {
        StoreError::config(
            BACKEND,
            format!("{why}; the form is dynamodb://TABLE?region=REGION&endpoint=URL"),
        )
    };
    let rest = url
        .strip_prefix("dynamodb://")
        .ok_or_else(|| bad("a DynamoDB store URL begins with dynamodb://"))?;
    let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
    let table = table.trim_end_matches('/');
    if table.is_empty() {
        return Err(bad("the URL names no table"));
    }
    check_table(table)?;
    let (mut region, mut endpoint) = (None, None);
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*name {
            "region" => region = Some(value.into_owned()),
            "endpoint" => endpoint = Some(value.into_owned()),
            other => return Err(bad(&format!("unknown option {other:?}"))),
        }
    }
    let region = region
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .filter(|r| !r.is_empty())
        .ok_or_else(|| bad("no region: give region= or set AWS_REGION"))?;
    Ok((table.to_owned(), region, endpoint))
}

/// A DynamoDB table name: 3 to 255 of `a-z A-Z 0-9 _ - .`.
fn check_table(table: &str) -> Result<(), StoreError> {
    let valid = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(StoreError::config(
            BACKEND,
            format!("{table:?} is not a DynamoDB table name (3 to 255 of a-z, A-Z, 0-9, _ - .)"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_table_a_region_and_an_endpoint() {
        let (table, region, endpoint) = parse_url(
            "dynamodb://idem-records?region=eu-west-1&endpoint=http%3A%2F%2F127.0.0.1%3A5000",
        )
        .unwrap();
        assert_eq!(table, "idem-records");
        assert_eq!(region, "eu-west-1");
        assert_eq!(endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        let (_, _, endpoint) = parse_url("dynamodb://idem?region=us-east-1").unwrap();
        assert_eq!(endpoint, None);
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, says) in [
            ("redis://x", "begins with dynamodb://"),
            ("dynamodb://?region=x", "names no table"),
            ("dynamodb://a b?region=x", "not a DynamoDB table name"),
            ("dynamodb://idem?region=x&pool=3", "unknown option"),
        ] {
            let error = parse_url(url).unwrap_err().to_string();
            assert!(error.contains(says), "{url}: {error}");
        }
    }
}
