//! What every test binary of this crate shares, over `idem-testing`: the
//! shared server, skip-or-fail, unique prefixes and their cleanup.

pub(crate) mod servers;

use std::time::Duration;

use idem_testing::Server;
#[allow(unused_imports)]
pub(crate) use idem_testing::{skip, skip_binary, Cleanup};

/// The shared server's address: `IDEM_REDIS_URL`, else the local default.
pub(crate) fn redis_url() -> String {
    Server::Redis.url()
}

/// The shared server's address if it answers; otherwise prints why the test
/// is skipped, or panics when `CI` is set (CI must not skip silently).
pub(crate) fn shared_server() -> Option<String> {
    let url = redis_url();
    match ping(&url) {
        Ok(()) => Some(url),
        Err(error) => skip(&format!("no Redis at {url} ({error}); set IDEM_REDIS_URL")),
    }
}

pub(crate) fn ping(url: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
    redis::cmd("PING").query::<String>(&mut connection)?;
    Ok(())
}

/// A prefix no other fixture or test run uses.
pub(crate) fn unique_prefix() -> String {
    format!("{}:", idem_testing::unique_name("idem-test"))
}

/// Deletes every key under `prefix` when dropped, so that tests leave
/// nothing behind on the shared server and never flush it.
pub(crate) fn delete_prefix(url: &str, prefix: &str) -> Cleanup {
    Cleanup::redis_prefix(url, prefix)
}
