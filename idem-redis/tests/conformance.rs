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
    Fixture::new(store, support::delete_prefix(&url, &prefix))
}

idem_conformance::store_tests!(factory);

/// The whole kit again, through a near cache in front of the store.
mod near_cache {
    async fn factory() -> idem_conformance::Fixture {
        super::factory().await.with_near_cache()
    }

    idem_conformance::store_tests!(factory);
}
