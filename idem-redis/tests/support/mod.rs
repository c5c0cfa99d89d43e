//! What every test binary of this crate shares: finding the shared server,
//! skipping without one, unique prefixes and their cleanup.

pub(crate) mod servers;

use std::io::Write;
use std::time::Duration;

use redis::Commands;

/// The shared server's address: `IDEM_REDIS_URL`, else the local default.
pub(crate) fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
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

/// Skips with `reason`, or fails when `CI` is set.
pub(crate) fn skip<T>(reason: &str) -> Option<T> {
    if std::env::var_os("CI").is_some() {
        panic!("{reason} (CI is set, so this fails instead of skipping)");
    }
    eprintln!("skipping: {reason}");
    None
}

/// Skips every test of this binary: for test files whose tests all need
/// the same server and come from a macro that cannot skip one by one.
/// Fails instead when `CI` is set.
pub(crate) fn skip_binary(reason: &str) -> ! {
    if std::env::var_os("CI").is_some() {
        panic!("{reason} (CI is set, so this fails instead of skipping)");
    }
    // Straight to stderr: the test harness would swallow a captured
    // `eprintln!` when the process exits here.
    let _ = writeln!(
        std::io::stderr(),
        "skipping every test of this binary: {reason}"
    );
    std::process::exit(0)
}

pub(crate) fn ping(url: &str) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
    redis::cmd("PING").query::<String>(&mut connection)?;
    Ok(())
}

/// A prefix no other fixture or test run uses.
pub(crate) fn unique_prefix() -> String {
    format!("idem-test:{:032x}:", rand::random::<u128>())
}

/// Deletes every key under its prefix when dropped, so that tests leave
/// nothing behind on the shared server and never flush it.
#[derive(Debug)]
pub(crate) struct DeletePrefix {
    url: String,
    prefix: String,
}

impl DeletePrefix {
    pub(crate) fn new(url: &str, prefix: &str) -> DeletePrefix {
        DeletePrefix {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        }
    }
}

impl Drop for DeletePrefix {
    fn drop(&mut self) {
        // A cleanup that fails leaves keys that expire with their retention;
        // it must not turn a passing case into a panic.
        let cleanup = || -> redis::RedisResult<()> {
            let client = redis::Client::open(self.url.as_str())?;
            let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
            let keys: Vec<Vec<u8>> = connection
                .scan_match::<_, Vec<u8>>(format!("{}*", self.prefix))?
                .collect::<Result<_, _>>()?;
            for batch in keys.chunks(500) {
                connection.del::<_, ()>(batch)?;
            }
            Ok(())
        };
        if let Err(error) = cleanup() {
            eprintln!("could not delete the keys under {:?}: {error}", self.prefix);
        }
    }
}
