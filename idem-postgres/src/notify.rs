//! Waking waiters with `LISTEN`/`NOTIFY`: the channel of a table, and the
//! one listener connection a store keeps for all its waiters.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use idem_core::store::Wakeups;
use sqlx::postgres::{PgListener, PgPool};

use crate::schema::TableName;

/// The notification channel of a table: `idem:` and the table's name, or
/// `idem:` and a hash of it when that would pass PostgreSQL's 63-byte limit
/// on identifiers. Validated names hold no quote, so the channel may be
/// spliced into SQL as a literal.
pub(crate) fn channel(name: &TableName) -> String {
    let display = name.display();
    let plain = format!("idem:{display}");
    if plain.len() <= 63 {
        return plain;
    }
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = display.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("idem:{hash:016x}")
}

/// The wake-ups of one store and its listener task, started on first use
/// and aborted when the last clone of the store is dropped.
#[derive(Debug, Default)]
pub(crate) struct Listener {
    started: OnceLock<Started>,
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

impl Listener {
    /// The wake-ups, starting the listener on the first call.
    pub(crate) fn wakeups(&self, pool: &PgPool, channel: &str) -> Arc<Wakeups> {
        let started = self.started.get_or_init(|| {
            let wakeups = Arc::new(Wakeups::disconnected());
            let task = tokio::spawn(listen(
                pool.clone(),
                channel.to_owned(),
                Arc::downgrade(&wakeups),
            ));
            Started {
                wakeups,
                task: task.abort_handle(),
            }
        });
        Arc::clone(&started.wakeups)
    }
}

// Reconnection backs off from the first to the longest pause, so a
// database that is down is not hammered.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const LONGEST_RETRY: Duration = Duration::from_secs(2);

/// Listens on `channel` and wakes the waiters of every key notified, for as
/// long as anyone holds the wake-ups. A lost connection marks the wake-ups
/// disconnected (waiters poll on their full backoff meanwhile) and is
/// replaced; each (re)connection wakes every waiter, since notifications
/// may have been lost in the gap.
async fn listen(pool: PgPool, channel: String, wakeups: Weak<Wakeups>) {
    let mut retry = FIRST_RETRY;
    loop {
        let listener = match PgListener::connect_with(&pool).await {
            Ok(mut listener) => {
                listener.eager_reconnect(false);
                match listener.listen(&channel).await {
                    Ok(()) => Some(listener),
                    Err(error) => {
                        tracing::warn!(%channel, %error, "cannot LISTEN; waiters poll");
                        None
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%channel, %error, "no listener connection; waiters poll");
                None
            }
        };
        let Some(mut listener) = listener else {
            if wakeups.strong_count() == 0 {
                return;
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(LONGEST_RETRY);
            continue;
        };
        retry = FIRST_RETRY;
        match wakeups.upgrade() {
            Some(wakeups) => wakeups.set_connected(true),
            None => return,
        }
        loop {
            let received = listener.try_recv().await;
            let Some(wakeups) = wakeups.upgrade() else {
                return;
            };
            match received {
                Ok(Some(notification)) => wakeups.wake(notification.payload()),
                Ok(None) => {
                    tracing::warn!(%channel, "listener connection lost; reconnecting");
                    wakeups.set_connected(false);
                    break;
                }
                Err(error) => {
                    tracing::warn!(%channel, %error, "listener failed; reconnecting");
                    wakeups.set_connected(false);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_fit_an_identifier_and_keep_tables_apart() {
        let short = TableName::parse("app.idem").unwrap();
        assert_eq!(channel(&short), "idem:app.idem");
        let long_a = TableName::parse(&format!("{}.a", "s".repeat(60))).unwrap();
        let long_b = TableName::parse(&format!("{}.b", "s".repeat(60))).unwrap();
        assert!(channel(&long_a).len() <= 63);
        assert_ne!(channel(&long_a), channel(&long_b));
    }
}
