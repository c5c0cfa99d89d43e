//! What the kit cannot check: a missing table, an unreachable endpoint, an
//! item that does not decode, and throttling past the retries, each a
//! typed error that says whether the work ran.
//!
//! moto never throttles, so the throttling cases put a relay between the
//! store and moto that answers `ProvisionedThroughputExceededException`
//! once it is told to, as DynamoDB does when a table is over its capacity.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use idem_core::store::{Store, StoreErrorKind};
use idem_core::{Error, Idempotent, When};
use idem_dynamodb::DynamoStore;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[tokio::test]
async fn a_missing_table_is_a_config_error() {
    support::require_for_binary();
    let store = support::store_on(&idem_testing::unique_name("idem_absent"));
    let error = store.check().await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Config, "{error}");
    assert!(
        error.to_string().contains("ResourceNotFoundException"),
        "{error}"
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_fails_before_the_work() {
    // A port nothing listens on: bound, then closed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let store = DynamoStore::from_client(
        reqwest::Client::new(),
        "idem_nowhere",
        support::REGION,
        Some(&endpoint),
        support::credentials(),
    )
    .unwrap();
    let ran = AtomicBool::new(false);
    let result = Idempotent::new(store)
        .execute("k", "body", || async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, ()>(1)
        })
        .await;
    assert!(
        matches!(result, Err(Error::Store { when: When::BeforeWork, ref source }) if source.kind() == StoreErrorKind::Backend),
        "{result:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the work ran");
}

#[tokio::test]
async fn an_item_that_does_not_decode_is_corrupt_not_a_panic() {
    support::require_for_binary();
    let (store, _guard) = support::fresh_store().await;
    let idem = Idempotent::new(store.clone());
    let key = idem.key("bad").unwrap();
    // A live record whose state code is 7.
    let far = 4_000_000_000_000i64.to_string();
    store
        .request(
            "PutItem",
            json!({
                "TableName": store.table(),
                "Item": {
                    "pk": { "S": key.as_str() }, "tk": { "B": "AAAAAAAAAAAAAAAAAAAAAA==" },
                    "fp": { "B": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=" },
                    "st": { "N": "7" }, "rt": { "N": far },
                },
            }),
        )
        .await
        .unwrap();
    let error = store.load(key.as_str()).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{error}");
    let ran = AtomicBool::new(false);
    let result = idem
        .execute("bad", "body", || async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, ()>(1)
        })
        .await;
    assert!(
        matches!(result, Err(Error::Store { when: When::BeforeWork, ref source }) if source.kind() == StoreErrorKind::Corrupt),
        "{result:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the work ran");
}

/// A relay to moto that answers every call with throttling while
/// `throttle` is set, and counts the calls it refused.
struct Relay {
    endpoint: String,
    throttle: Arc<AtomicBool>,
    refused: Arc<AtomicUsize>,
}

async fn relay() -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let throttle = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let (flag, count) = (Arc::clone(&throttle), Arc::clone(&refused));
    tokio::spawn(async move {
        let upstream = reqwest::Client::new();
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let (flag, count, upstream) = (Arc::clone(&flag), Arc::clone(&count), upstream.clone());
            tokio::spawn(async move {
                let Some((headers, body)) = read_request(&mut socket).await else {
                    return;
                };
                let reply = if flag.load(Ordering::SeqCst) {
                    count.fetch_add(1, Ordering::SeqCst);
                    let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded."}"#;
                    format!(
                        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .into_bytes()
                } else {
                    let mut request = upstream.post(support::endpoint()).body(body);
                    for (name, value) in headers {
                        if name != "host" && name != "content-length" {
                            request = request.header(name, value);
                        }
                    }
                    let response = request.send().await.expect("moto answers");
                    let status = response.status();
                    let bytes = response.bytes().await.expect("moto's body");
                    let mut reply = format!(
                        "HTTP/1.1 {} x\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        status.as_u16(),
                        bytes.len()
                    )
                    .into_bytes();
                    reply.extend_from_slice(&bytes);
                    reply
                };
                let _ = socket.write_all(&reply).await;
            });
        }
    });
    Relay {
        endpoint,
        throttle,
        refused,
    }
}

/// Reads one HTTP/1.1 request with a `content-length` body.
async fn read_request(
    socket: &mut tokio::net::TcpStream,
) -> Option<(Vec<(String, String)>, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let read = socket.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let read = socket.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
    Some((headers, buffer[head_end..head_end + length].to_vec()))
}

#[tokio::test]
async fn a_claim_throttled_past_the_retries_fails_before_the_work() {
    support::require_for_binary();
    let (store, _guard) = support::fresh_store().await;
    let relay = relay().await;
    let through = DynamoStore::from_client(
        reqwest::Client::new(),
        store.table(),
        support::REGION,
        Some(&relay.endpoint),
        support::credentials(),
    )
    .unwrap()
    .with_retries(3);
    relay.throttle.store(true, Ordering::SeqCst);
    let ran = AtomicBool::new(false);
    let result = Idempotent::new(through)
        .execute("k", "body", || async {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, ()>(1)
        })
        .await;
    match result {
        Err(Error::Store {
            when: When::BeforeWork,
            source,
        }) => assert!(
            source.to_string().contains("ProvisionedThroughputExceeded"),
            "{source}"
        ),
        other => panic!("expected a store error before the work, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the work ran");
    assert_eq!(
        relay.refused.load(Ordering::SeqCst),
        4,
        "one call and 3 retries"
    );
    assert_eq!(
        support::stored_records(&store).await,
        0,
        "a throttled claim stored nothing"
    );
}

#[tokio::test]
async fn a_completion_throttled_past_the_retries_fails_after_the_work() {
    support::require_for_binary();
    let (store, _guard) = support::fresh_store().await;
    let relay = relay().await;
    let through = DynamoStore::from_client(
        reqwest::Client::new(),
        store.table(),
        support::REGION,
        Some(&relay.endpoint),
        support::credentials(),
    )
    .unwrap()
    .with_retries(2);
    let runs = AtomicUsize::new(0);
    let idem = Idempotent::new(through);
    let key = idem.key("k").unwrap();
    let result = idem
        .execute("k", "body", || async {
            runs.fetch_add(1, Ordering::SeqCst);
            // The claim went through; from now on the table is over its
            // capacity.
            relay.throttle.store(true, Ordering::SeqCst);
            Ok::<_, ()>(1)
        })
        .await;
    assert!(
        matches!(
            result,
            Err(Error::Store {
                when: When::AfterWork,
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        relay.refused.load(Ordering::SeqCst),
        3,
        "one call and 2 retries"
    );
    // The claim stands, in flight: a retry waits for its lease.
    let record = store.load(key.as_str()).await.unwrap();
    assert!(record.is_some_and(|r| r.state == idem_core::store::State::InFlight));
}
