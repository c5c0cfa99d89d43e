//! SQL pools for tests: the probe-then-pool dance every SQL store's tests
//! need, once.

use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database, Pool};

use crate::skip::skip;
use crate::Server;

/// A pool of up to `size` connections to `server` at `url`, or `None` (with
/// the reason printed) when it cannot be reached; under `CI` an
/// unreachable server fails the test instead.
///
/// One direct connection is tried first: a pool retries a refused
/// connection until its acquire timeout (30 s here, so that a loaded
/// machine's slow answers are not failures), which would make skipping
/// slow.
pub async fn sql_pool<DB: Database>(server: Server, url: &str, size: u32) -> Option<Pool<DB>> {
    let probe = match DB::Connection::connect(url).await {
        Ok(conn) => conn.close().await,
        Err(error) => Err(error),
    };
    let connected = match probe {
        Ok(()) => {
            PoolOptions::<DB>::new()
                .max_connections(size)
                .acquire_timeout(Duration::from_secs(30))
                .connect(url)
                .await
        }
        Err(error) => Err(error),
    };
    connected.map_or_else(
        |error| {
            skip(&format!(
                "{} at {url} is unreachable ({error}); set {}",
                server.name(),
                server.env_var()
            ))
        },
        Some,
    )
}
