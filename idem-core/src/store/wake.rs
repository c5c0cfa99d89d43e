//! `Wakeups`: how a store tells waiters that a key's outcome is recorded.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

/// The keys waiters are watching, and the means to wake them: the optional
/// capability a store offers through [`Store::wakeups`](crate::store::Store::wakeups).
///
/// A store that offers it calls [`wake`](Wakeups::wake) with the storage
/// key once a completion, a failure or a release of that key has taken
/// effect — in process after its atomic step (memory, SQLite), or from a
/// listener that hears the backend's notification (PostgreSQL `NOTIFY`,
/// Redis pub/sub). A waiter [`watch`](Wakeups::watch)es the key *before* it
/// reads the record again, so a wake-up between that read and its wait is
/// never missed.
///
/// Wake-ups are hints: a waiter always reads the record again, and it
/// still polls — slowly while wake-ups flow, on its full backoff while
/// [`is_connected`](Wakeups::is_connected) says they do not. A lost
/// notification therefore costs latency, never an outcome. A listener
/// calls [`set_connected`](Wakeups::set_connected) as its connection comes
/// and goes; both changes wake every watcher, since notifications may have
/// been lost in the gap.
pub struct Wakeups {
    keys: Mutex<HashMap<String, Slot>>,
    connected: AtomicBool,
    sent: AtomicU64,
    disconnections: AtomicU64,
}

struct Slot {
    sender: watch::Sender<u64>,
    watchers: usize,
}

impl Wakeups {
    /// Wake-ups that flow from the start, as they do in process.
    pub fn new() -> Wakeups {
        Wakeups {
            keys: Mutex::new(HashMap::new()),
            connected: AtomicBool::new(true),
            sent: AtomicU64::new(0),
            disconnections: AtomicU64::new(0),
        }
    }

    /// Wake-ups that do not flow until a listener says it is connected.
    pub fn disconnected() -> Wakeups {
        let wakeups = Wakeups::new();
        wakeups.connected.store(false, Ordering::SeqCst);
        wakeups
    }

    /// Starts watching `key`: every [`wake`](Wakeups::wake) of it from now
    /// on completes the returned watch's [`woken`](Watch::woken).
    pub fn watch(self: &Arc<Self>, key: &str) -> Watch {
        let mut keys = self.lock();
        let slot = keys.entry(key.to_owned()).or_insert_with(|| Slot {
            sender: watch::channel(0).0,
            watchers: 0,
        });
        slot.watchers += 1;
        Watch {
            receiver: slot.sender.subscribe(),
            wakeups: Arc::clone(self),
            key: key.to_owned(),
        }
    }

    /// Wakes every waiter watching `key`. Cheap when nobody watches it.
    pub fn wake(&self, key: &str) {
        if let Some(slot) = self.lock().get(key) {
            slot.sender.send_modify(|n| *n += 1);
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Wakes every waiter, whatever it watches.
    pub fn wake_all(&self) {
        for slot in self.lock().values() {
            slot.sender.send_modify(|n| *n += 1);
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records whether notifications reach this process now, and wakes
    /// every waiter so that each reads its record again and picks its
    /// polling pace.
    pub fn set_connected(&self, connected: bool) {
        let was = self.connected.swap(connected, Ordering::SeqCst);
        if was && !connected {
            self.disconnections.fetch_add(1, Ordering::SeqCst);
        }
        if was != connected {
            self.wake_all();
        }
    }

    /// Whether notifications reach this process now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    /// How many times notifications stopped flowing (a listener's
    /// connection was lost).
    pub fn disconnections(&self) -> u64 {
        self.disconnections.load(Ordering::SeqCst)
    }

    /// How many keys are watched now.
    pub fn watched(&self) -> usize {
        self.lock().len()
    }

    /// How many wake-ups reached a watched key so far (each
    /// [`wake_all`](Wakeups::wake_all) counts once per key).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        // Every change under the lock is one insert, removal or counter
        // step, so a poisoned map is still consistent.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for Wakeups {
    fn default() -> Wakeups {
        Wakeups::new()
    }
}

impl fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeups")
            .field("watched", &self.watched())
            .field("connected", &self.is_connected())
            .finish()
    }
}

/// One waiter's interest in one key; stops watching when dropped.
pub struct Watch {
    receiver: watch::Receiver<u64>,
    wakeups: Arc<Wakeups>,
    key: String,
}

impl Watch {
    /// Completes at the first wake-up of the key since the watch began or
    /// since the last `woken` completed.
    pub async fn woken(&mut self) {
        // The sender lives in the map while this watch does, so `changed`
        // cannot fail; if it ever did, waking at once is the safe answer.
        let _ = self.receiver.changed().await;
    }

    /// Whether notifications reach this process now.
    pub fn is_connected(&self) -> bool {
        self.wakeups.is_connected()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut keys = self.wakeups.lock();
        if let Some(slot) = keys.get_mut(&self.key) {
            slot.watchers -= 1;
            if slot.watchers == 0 {
                keys.remove(&self.key);
            }
        }
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").field("key", &self.key).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_before_the_wait_is_not_missed() {
        let wakeups = Arc::new(Wakeups::new());
        let mut watch = wakeups.watch("k");
        wakeups.wake("k");
        tokio::time::timeout(std::time::Duration::from_secs(5), watch.woken())
            .await
            .expect("the wake-up sent before the wait was kept");
    }

    #[tokio::test]
    async fn a_dropped_watch_leaves_nothing_behind() {
        let wakeups = Arc::new(Wakeups::new());
        let one = wakeups.watch("k");
        let two = wakeups.watch("k");
        assert_eq!(wakeups.watched(), 1);
        drop(one);
        assert_eq!(wakeups.watched(), 1);
        drop(two);
        assert_eq!(wakeups.watched(), 0);
        wakeups.wake("k");
        assert_eq!(wakeups.sent(), 0, "nobody watched");
    }
}
