//! The store's one multiplexed connection, opened again after it fails:
//! to one server, or to whichever server Redis Sentinel names the master.
//! A call that finds the connection gone, timed out, or (under Sentinel)
//! the server a replica now fails, and makes the next call connect again.
//! A timed-out connection is never used again: on a half-open connection
//! (requests arrive, no reply comes back) every later call would time out
//! too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisResult, Value};

use crate::connection::{Reply, Shared};

/// Where the connection goes.
enum Source {
    /// One server.
    Server(redis::Client),
    /// The master the Sentinels name.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

/// The connection, found again after it fails.
pub(crate) struct Reconnecting {
    source: Source,
    /// How long a call waits for a connection.
    connect_timeout: Duration,
    /// How long a call waits for a reply, in milliseconds: it grows when
    /// the store waits for replicas (`reply_timeout_at_least`).
    reply_timeout_ms: AtomicU64,
    /// Serialises connecting, so that one failure opens one connection.
    connecting: tokio::sync::Mutex<()>,
    /// The current connection and its generation: a failure forgets only
    /// the connection it happened on.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generations: AtomicU64,
}

impl Reconnecting {
    /// To the server `client` names; `timeouts` to connect and for a reply.
    pub(crate) fn server(client: redis::Client, timeouts: (Duration, Duration)) -> Reconnecting {
        Reconnecting::new(Source::Server(client), timeouts)
    }

    /// To the master the Sentinels name, with 5 s timeouts.
    pub(crate) fn sentinel(sentinels: SentinelClient) -> Reconnecting {
        let timeouts = (Duration::from_secs(5), Duration::from_secs(5));
        Reconnecting::new(
            Source::Sentinel(tokio::sync::Mutex::new(sentinels)),
            timeouts,
        )
    }

    fn new(source: Source, timeouts: (Duration, Duration)) -> Reconnecting {
        Reconnecting {
            source,
            connect_timeout: timeouts.0,
            reply_timeout_ms: AtomicU64::new(millis(timeouts.1)),
            connecting: tokio::sync::Mutex::new(()),
            current: Mutex::new(None),
            generations: AtomicU64::new(0),
        }
    }

    /// The connection: the last one, or a new one.
    pub(crate) async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = lock(&self.current).clone() {
            return Ok(current);
        }
        let _connecting = self.connecting.lock().await;
        // Another call may have connected while this one waited.
        if let Some(current) = lock(&self.current).clone() {
            return Ok(current);
        }
        let reply_timeout = self.reply_timeout_ms.load(Ordering::Relaxed);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(Duration::from_millis(reply_timeout)));
        let connection = match &self.source {
            Source::Server(client) => {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?
            }
            Source::Sentinel(sentinels) => {
                sentinels
                    .lock()
                    .await
                    .async_get_client()
                    .await?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?
            }
        };
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        *lock(&self.current) = Some((generation, connection.clone()));
        Ok((generation, connection))
    }

    /// Forgets connection `generation` after `error` on it, when the error
    /// says the server is gone, did not answer in time, or is no longer
    /// the master.
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

impl Shared for Reconnecting {
    /// A longer wait than the connection's own takes a new connection:
    /// the current one is forgotten, and the next call opens one with it.
    fn reply_timeout_at_least(&self, timeout: Duration) {
        let wanted = millis(timeout);
        if self.reply_timeout_ms.fetch_max(wanted, Ordering::Relaxed) < wanted {
            *lock(&self.current) = None;
        }
    }

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

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
