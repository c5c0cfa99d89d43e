//! The whole conformance kit, and more, on a real 3-master Redis Cluster
//! started once for this test binary from the `redis-server` binary (free
//! loopback ports, its own temporary directory, no persistence) and torn
//! down when the binary exits, however it exits.

#[allow(dead_code)]
mod support;

use std::convert::Infallible;
use std::sync::OnceLock;

use idem_conformance::Fixture;
use idem_core::Idempotent;
use idem_redis::RedisStore;
use serde_json::json;
use support::servers::{self, Servers};

/// The cluster, or why there is none. A `static` is never dropped: the
/// servers' watchdog tears them down when this process exits (see
/// `support::servers`).
static CLUSTER: OnceLock<Result<Servers, String>> = OnceLock::new();

/// The cluster's node URLs. Skips the whole binary when the binaries are
/// missing (fails when `CI` is set).
fn cluster() -> Vec<String> {
    let cluster = CLUSTER.get_or_init(|| match servers::binaries_missing() {
        Some(reason) => Err(reason),
        None => Ok(Servers::cluster(3).unwrap_or_else(|e| panic!("cannot start a cluster: {e}"))),
    });
    match cluster {
        Ok(servers) => servers.urls(),
        Err(reason) => support::skip_binary(reason),
    }
}

/// A store on the cluster under a fresh prefix. Nothing is deleted
/// afterwards: the whole cluster goes away with the test binary.
async fn cluster_store() -> RedisStore {
    RedisStore::connect_cluster(cluster())
        .await
        .expect("connect to the cluster")
        .with_prefix(support::unique_prefix())
}

async fn factory() -> Fixture {
    let store = cluster_store().await;
    let prefix = store.prefix().to_owned();
    support::counting_keys(Fixture::new(store, ()), cluster(), &prefix)
}

idem_conformance::store_tests!(factory);

#[tokio::test]
async fn records_spread_over_every_master_and_replay_from_each() {
    let idem = Idempotent::new(cluster_store().await);
    for n in 0..60u32 {
        let key = format!("order-{n}");
        let first: u32 = idem
            .execute(&key, &json!({ "n": n }), || async {
                Ok::<_, Infallible>(n)
            })
            .await
            .unwrap();
        let replay: u32 = idem
            .execute(&key, &json!({ "n": n }), || async {
                Ok::<_, Infallible>(u32::MAX)
            })
            .await
            .unwrap();
        assert_eq!((first, replay), (n, n), "key {key}");
    }
    for url in cluster() {
        let keys: u64 = servers::query(&url, &mut idem_redis::redis::cmd("DBSIZE")).unwrap();
        assert!(keys > 0, "no record landed on {url}");
    }
}

/// The whole kit again on a cluster whose masters have a replica each,
/// with every write waiting for its master's replica.
mod replica_acks {
    use std::sync::OnceLock;
    use std::time::Duration;

    use idem_conformance::Fixture;
    use idem_redis::RedisStore;

    use super::support::servers::{self, Servers};

    static CLUSTER: OnceLock<Result<Servers, String>> = OnceLock::new();

    async fn factory() -> Fixture {
        let cluster = CLUSTER.get_or_init(|| match servers::binaries_missing() {
            Some(reason) => Err(reason),
            None => Ok(Servers::cluster_with_replicas(3, "")
                .unwrap_or_else(|e| panic!("cannot start a cluster with replicas: {e}"))),
        });
        let urls = match cluster {
            Ok(servers) => servers.urls(),
            Err(reason) => super::support::skip_binary(reason),
        };
        let prefix = super::support::unique_prefix();
        let store = RedisStore::connect_cluster(urls.clone())
            .await
            .expect("connect to the cluster")
            .with_prefix(&prefix)
            .with_replica_acks(1, Duration::from_secs(5));
        super::support::counting_keys(Fixture::new(store, ()), urls, &prefix)
    }

    idem_conformance::store_tests!(factory);
}
