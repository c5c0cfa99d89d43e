//! The whole conformance kit against the Redis at `IDEM_REDIS_URL`
//! (default `redis://127.0.0.1:6379`), nothing flushed: each case gets a
//! store under a fresh random key prefix, whose keys are deleted when the
//! case ends.

#[allow(dead_code)]
mod support;

use std::sync::OnceLock;

use idem_conformance::Fixture;
use idem_redis::RedisStore;
use support::DeletePrefix;

/// The shared server's URL, checked once per test binary.
fn server() -> &'static str {
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    let url = support::redis_url();
    let server = SERVER.get_or_init(|| match support::ping(&url) {
        Ok(()) => Ok(url.clone()),
        Err(error) => Err(format!("no Redis at {url} ({error}); set IDEM_REDIS_URL")),
    });
    match server {
        Ok(url) => url,
        Err(reason) => support::skip_binary(reason),
    }
}

async fn factory() -> Fixture {
    let url = server();
    let prefix = support::unique_prefix();
    let store = RedisStore::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
        .with_prefix(&prefix);
    Fixture::new(store, DeletePrefix::new(url, &prefix))
}

idem_conformance::store_tests!(factory);
