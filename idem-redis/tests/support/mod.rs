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

/// `fixture`, counting its records as the conformance kit's
/// `stored_count` asks: the keys under `prefix` on every master among
/// `urls` (a replica's copies are not counted again). `SCAN` skips a key
/// Redis has expired by itself, so such a record counts as gone.
pub(crate) fn counting_keys(
    fixture: idem_conformance::Fixture,
    urls: Vec<String>,
    prefix: &str,
) -> idem_conformance::Fixture {
    let pattern = format!("{}*", glob_escape(prefix));
    fixture.with_stored_count(move || {
        let (urls, pattern) = (urls.clone(), pattern.clone());
        async move {
            tokio::task::spawn_blocking(move || count_keys(&urls, &pattern))
                .await
                .expect("the count ran")
        }
    })
}

fn count_keys(urls: &[String], pattern: &str) -> usize {
    let mut keys = 0;
    for url in urls {
        match count_on_master(url, pattern) {
            Ok(counted) => keys += counted.unwrap_or(0),
            Err(error) => panic!("cannot count the keys {pattern} at {url}: {error}"),
        }
    }
    keys
}

/// The keys matching `pattern` at `url`, or `None` for a replica.
fn count_on_master(url: &str, pattern: &str) -> redis::RedisResult<Option<usize>> {
    use redis::Commands;
    let client = redis::Client::open(url)?;
    let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let replication: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut connection)?;
    if !replication.contains("role:master") {
        return Ok(None);
    }
    let found = connection.scan_match::<_, Vec<u8>>(pattern)?;
    Ok(Some(found.count()))
}

/// `text` with the glob characters of `SCAN … MATCH` escaped.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}
