//! The whole conformance kit against the Redis at `IDEM_REDIS_URL`
//! (default `redis://127.0.0.1:6379`), nothing flushed: each case gets a
//! store under a fresh random key prefix, whose keys are deleted when the
//! case ends.

#[allow(dead_code)]
mod support;

use idem_conformance::Fixture;
use idem_redis::RedisStore;

async fn factory() -> Fixture {
    let url = idem_testing::Server::Redis.require_for_binary();
    let prefix = support::unique_prefix();
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
        .with_prefix(&prefix);
    let fixture = Fixture::new(store, support::delete_prefix(&url, &prefix));
    support::counting_keys(fixture, vec![url], &prefix)
}

idem_conformance::store_tests!(factory);

/// The whole kit again, through a near cache in front of the store.
mod near_cache {
    async fn factory() -> idem_conformance::Fixture {
        super::factory().await.with_near_cache()
    }

    idem_conformance::store_tests!(factory);
}

/// The whole kit again on a master of its own with one replica, through a
/// store that waits for the replica to acknowledge every write: the
/// pipelines that carry `WAIT` change no answer.
mod replica_acks {
    use std::sync::OnceLock;
    use std::time::Duration;

    use idem_conformance::Fixture;
    use idem_redis::RedisStore;

    use super::support::servers::{self, Servers};

    /// The servers, or why there are none; torn down with the binary.
    static SERVERS: OnceLock<Result<(Servers, Servers), String>> = OnceLock::new();

    async fn factory() -> Fixture {
        let servers = SERVERS.get_or_init(|| match servers::binaries_missing() {
            Some(reason) => Err(reason),
            None => Ok(Servers::replicated()
                .unwrap_or_else(|e| panic!("cannot start a master and a replica: {e}"))),
        });
        let master = match servers {
            Ok((master, _)) => master.urls().remove(0),
            Err(reason) => super::support::skip_binary(reason),
        };
        let prefix = super::support::unique_prefix();
        let store = RedisStore::connect(master.as_str())
            .await
            .expect("connect to the master")
            .with_prefix(&prefix)
            .with_replica_acks(1, Duration::from_secs(5));
        super::support::counting_keys(Fixture::new(store, ()), vec![master], &prefix)
    }

    idem_conformance::store_tests!(factory);
}
