//! Waking waiters with pub/sub: the scripts that record an outcome or
//! release a key `PUBLISH` it on the store's channel, and one subscriber
//! connection per store wakes the waiters of each key it hears.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use idem_core::store::Wakeups;
use redis::aio::PubSub;
use redis::{Client, ConnectionAddr, RedisResult};

/// The channel a store with `prefix` publishes on.
pub(crate) fn channel(prefix: &[u8]) -> Vec<u8> {
    let mut channel = prefix.to_vec();
    channel.extend_from_slice(b"wake-ups");
    channel
}

/// The wake-ups of one store and its subscriber task, started on first use
/// and aborted when the last clone of the store is dropped.
#[derive(Debug, Default)]
pub(crate) struct Subscriber {
    started: OnceLock<Started>,
    /// The subscriber connection's local address while it is connected
    /// over TCP: what `CLIENT LIST` shows as its `addr`.
    addr: Arc<Mutex<Option<SocketAddr>>>,
}

#[derive(Debug)]
struct Started {
    wakeups: Arc<Wakeups>,
    task: tokio::task::AbortHandle,
}

impl Drop for Started {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscriber {
    /// The wake-ups, starting the subscriber on the first call.
    pub(crate) fn wakeups(&self, client: &Client, prefix: &Arc<[u8]>) -> Arc<Wakeups> {
        let started = self.started.get_or_init(|| {
            let wakeups = Arc::new(Wakeups::disconnected());
            let task = tokio::spawn(listen(
                client.clone(),
                Arc::clone(prefix),
                Arc::downgrade(&wakeups),
                Arc::clone(&self.addr),
            ));
            Started {
                wakeups,
                task: task.abort_handle(),
            }
        });
        Arc::clone(&started.wakeups)
    }

    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        *self.addr.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// Reconnection backs off from the first to the longest pause, so a server
// that is down is not hammered.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const LONGEST_RETRY: Duration = Duration::from_secs(2);

/// Opens a pub/sub connection subscribed to `channel`; over TCP the
/// connection is opened here so that its local address is known.
async fn subscribe(client: &Client, channel: &[u8]) -> RedisResult<(PubSub, Option<SocketAddr>)> {
    let info = client.get_connection_info();
    let (mut pubsub, addr) = match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
            let _ = stream.set_nodelay(true);
            let addr = stream.local_addr().ok();
            (PubSub::new(info.redis_settings(), stream).await?, addr)
        }
        _ => (client.get_async_pubsub().await?, None),
    };
    pubsub.subscribe(channel).await?;
    Ok((pubsub, addr))
}

/// Listens on the store's channel and wakes the waiters of every key
/// published, for as long as anyone holds the wake-ups. A lost connection
/// marks the wake-ups disconnected (waiters poll on their full backoff
/// meanwhile) and is replaced; each (re)connection wakes every waiter,
/// since messages may have been lost in the gap.
async fn listen(
    client: Client,
    prefix: Arc<[u8]>,
    wakeups: Weak<Wakeups>,
    addr: Arc<Mutex<Option<SocketAddr>>>,
) {
    let channel = channel(&prefix);
    let set_addr = |to| *addr.lock().unwrap_or_else(PoisonError::into_inner) = to;
    let mut retry = FIRST_RETRY;
    loop {
        let (pubsub, local) = match subscribe(&client, &channel).await {
            Ok(connected) => connected,
            Err(error) => {
                tracing::warn!(%error, "no wake-up subscriber connection; waiters poll");
                if wakeups.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(LONGEST_RETRY);
                continue;
            }
        };
        retry = FIRST_RETRY;
        set_addr(local);
        match wakeups.upgrade() {
            Some(wakeups) => wakeups.set_connected(true),
            None => return,
        }
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            let Some(wakeups) = wakeups.upgrade() else {
                return;
            };
            // The scripts publish the record's Redis key; waiters watch
            // the store key after the prefix.
            let published = message.get_payload_bytes();
            if let Some(key) = published.strip_prefix(&*prefix) {
                if let Ok(key) = std::str::from_utf8(key) {
                    wakeups.wake(key);
                }
            }
        }
        set_addr(None);
        tracing::warn!("wake-up subscriber connection lost; reconnecting");
        match wakeups.upgrade() {
            Some(wakeups) => wakeups.set_connected(false),
            None => return,
        }
    }
}
