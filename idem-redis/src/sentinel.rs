//! A connection to whichever server Redis Sentinel names the master: the
//! store's calls go to it, and a call that finds it gone, or finds it a
//! replica now, makes the next call ask the Sentinels again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisResult, Value};

use crate::connection::{Reply, Shared};

/// How long a call waits for a connection to the master, and for a reply.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The master's connection, found through the Sentinels and found again
/// after it fails.
pub(crate) struct SentinelMaster {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the master the Sentinels named last, and its
    /// generation: a failure forgets only the connection it happened on.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generations: AtomicU64,
}

impl SentinelMaster {
    pub(crate) fn new(sentinels: SentinelClient) -> SentinelMaster {
        SentinelMaster {
            sentinels: tokio::sync::Mutex::new(sentinels),
            current: Mutex::new(None),
            generations: AtomicU64::new(0),
        }
    }

    /// The master's connection: the last one, or a new one to the master
    /// the Sentinels name now.
    pub(crate) async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = lock(&self.current).clone() {
            return Ok(current);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Another call may have connected while this one waited.
        if let Some(current) = lock(&self.current).clone() {
            return Ok(current);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT));
        let connection = sentinels
            .async_get_client()
            .await?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        *lock(&self.current) = Some((generation, connection.clone()));
        Ok((generation, connection))
    }

    /// Forgets connection `generation` after `error` on it, when the error
    /// says the server is gone or is no longer the master.
    fn failed(&self, generation: u64, error: &RedisError) {
        let lost = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.code() == Some("READONLY");
        if lost {
            let mut current = lock(&self.current);
            if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                *current = None;
            }
        }
    }
}

impl Shared for SentinelMaster {
    fn query<'a>(&'a self, cmd: &'a Cmd) -> Reply<'a> {
        Box::pin(async move {
            let (generation, mut connection) = self.connection().await?;
            let reply = connection
                .req_packed_command(cmd)
                .await
                .and_then(Value::extract_error);
            if let Err(error) = &reply {
                self.failed(generation, error);
            }
            reply
        })
    }

    fn transaction<'a>(&'a self, transaction: &'a Pipeline) -> Reply<'a> {
        Box::pin(async move {
            let (generation, mut connection) = self.connection().await?;
            let reply = transaction.query_async(&mut connection).await;
            if let Err(error) = &reply {
                self.failed(generation, error);
            }
            reply
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
