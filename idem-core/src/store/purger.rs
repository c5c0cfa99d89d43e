//! A background task that deletes expired records on a schedule.

use std::sync::Arc;
use std::time::Duration;

use metrics::{Label, SharedString};
use tokio::task::JoinHandle;

use crate::store::Store;

/// How many records one purge call deletes at most; the purger calls again
/// at once while a call deletes this many.
pub const PURGE_BATCH: usize = 1000;

/// Starts a tokio task that calls [`Store::purge_expired`] every `every`
/// (the first time at once), until the returned handle is aborted or the
/// runtime shuts down. Must be called within a tokio runtime.
///
/// For stores that do not expire records themselves (SQLite, PostgreSQL,
/// MySQL, memory); Redis expires its keys on its own and needs none. Each
/// round deletes in batches of [`PURGE_BATCH`] until a batch comes back
/// short, so one purge never holds a table long. Several purgers (one per
/// app server) may run against one database.
///
/// Counts `idem_purged_total` (records deleted) and
/// `idem_purge_errors_total` (failed calls, each also logged), labelled
/// `store` as [`Idempotent`](crate::Idempotent)'s metrics are. A failed
/// purge is retried at the next tick: expired records are absent to every
/// method anyway, so a late purge only costs space.
pub fn spawn_purger(store: Arc<dyn Store>, every: Duration) -> JoinHandle<()> {
    let every = every.max(crate::store::clamp::SHORTEST);
    let labels = vec![Label::new(
        "store",
        SharedString::from(crate::observe::store_name(&*store)),
    )];
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            loop {
                match store.purge_expired(PURGE_BATCH).await {
                    Ok(purged) => {
                        metrics::counter!("idem_purged_total", labels.clone())
                            .increment(purged as u64);
                        if purged > 0 {
                            tracing::debug!(purged, "purged expired idempotency records");
                        }
                        if purged < PURGE_BATCH {
                            break;
                        }
                    }
                    Err(error) => {
                        metrics::counter!("idem_purge_errors_total", labels.clone()).increment(1);
                        tracing::warn!(%error, "purging expired idempotency records failed");
                        break;
                    }
                }
            }
        }
    })
}
