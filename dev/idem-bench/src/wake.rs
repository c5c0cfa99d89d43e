//! The wake binary: how soon a waiter returns after the owner completes, woken by
//! its store's notifications or polling only, per store in one run.
//!
//! Each trial claims a fresh key, starts a waiter
//! (`Idempotent::with_wait`, the default 5–250 ms polling backoff), lets
//! it settle into its wait for a varying 0–49 ms, and completes the key.
//! The latency runs from the owner's `complete` call (its round trip
//! included) to the waiter's return; the reads are the waiter's claims of
//! the key, its store round trips. Where that time goes is printed beside
//! it: the owner's `complete` alone (its commit, and for PostgreSQL the
//! commit that sends the notification), and the time from `complete`
//! returning to the waiter's return (zero when the waiter was back first,
//! as when the store publishes before it answers).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem_core::store::{Insert, NewRecord, Record, Store, StoreError, Token, Wakeups};
use idem_core::{Begin, Fingerprint, Idempotent};

use idem_stores::StoreKind;

use crate::fixture::BoxError;
use crate::stores::target::{self, Opened};
use crate::stores::Places;

/// A store as the waiters see it: its claims counted, and its wake-ups
/// hidden for the polling-only rows.
#[derive(Debug)]
struct Probe {
    inner: Arc<dyn Store>,
    notified: bool,
    inserts: AtomicUsize,
}

#[async_trait]
impl Store for Probe {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        self.inserts.fetch_add(1, Ordering::SeqCst);
        self.inner.insert(key, record).await
    }
    async fn swap(
        &self,
        key: &str,
        expected: Token,
        r: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.swap(key, expected, r).await
    }
    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        r: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        self.inner.take_over(key, expected, r).await
    }
    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        self.inner.remove(key, expected).await
    }
    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.load(key).await
    }
    async fn reset(&self, key: &str) -> Result<idem_core::store::Reset, StoreError> {
        self.inner.reset(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
    fn wakeups(&self) -> Option<Arc<Wakeups>> {
        self.inner.wakeups().filter(|_| self.notified)
    }
}

/// One row: a store, woken or polling.
#[derive(Debug)]
pub(crate) struct WakeRow {
    pub(crate) store: &'static str,
    pub(crate) mode: &'static str,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    /// The owner's `complete` alone, p50 and p99.
    pub(crate) complete: (Duration, Duration),
    /// From `complete` returning to the waiter's return, p50 and p99.
    pub(crate) after: (Duration, Duration),
    pub(crate) reads: f64,
    pub(crate) lost: usize,
}

/// Measures `trials` wake-ups on `store`, notified (when the store sends
/// wake-ups) and polling only, alternating trial by trial.
pub(crate) async fn measure(
    name: &'static str,
    store: Arc<dyn Store>,
    tag: &str,
    trials: usize,
) -> Result<Vec<WakeRow>, BoxError> {
    let notifies = store.wakeups().is_some();
    let modes: &[(&'static str, bool)] = if notifies {
        &[("notified", true), ("polling", false)]
    } else {
        &[("polling", false)]
    };
    if let Some(wakeups) = store.wakeups() {
        // The listener connects on first use; measure it connected.
        for _ in 0..1000 {
            if wakeups.is_connected() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut samples = vec![Samples::default(); modes.len()];
    for trial in 0..trials {
        for (m, (mode, notified)) in modes.iter().enumerate() {
            let probe = Arc::new(Probe {
                inner: Arc::clone(&store),
                notified: *notified,
                inserts: AtomicUsize::new(0),
            });
            let idem = Idempotent::from_arc(probe.clone())
                .with_retention(Duration::from_secs(60))
                .with_wait(Duration::from_secs(10));
            let key = format!("{tag}-{mode}-{trial}");
            let fingerprint = Fingerprint::of_bytes(b"wake");
            let Begin::Run(lease) = idem.begin(&key, fingerprint).await? else {
                return Err(format!("{name}: key {key} was not fresh").into());
            };
            let waiter = tokio::spawn({
                let (idem, key) = (idem.clone(), key.clone());
                async move {
                    let answer = idem.begin(&key, fingerprint).await;
                    (answer, Instant::now())
                }
            });
            // Parked: its first claim, and (notified) its read after it
            // began watching; then a varying settle so polls are met at
            // every phase of the backoff.
            let parked = if *notified { 3 } else { 2 };
            while probe.inserts.load(Ordering::SeqCst) < parked {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            tokio::time::sleep(Duration::from_millis((trial * 7 % 50) as u64)).await;
            let start = Instant::now();
            lease.complete(b"1").await?;
            let completed = Instant::now();
            let (answer, returned) = waiter.await?;
            let sample = &mut samples[m];
            match answer {
                Ok(Begin::Replay(_)) => {
                    sample
                        .latency
                        .push(returned.saturating_duration_since(start));
                    sample.complete.push(completed - start);
                    sample
                        .after
                        .push(returned.saturating_duration_since(completed));
                }
                _ => sample.lost += 1,
            }
            // Every claim but the owner's is the waiter's.
            sample.reads += probe.inserts.load(Ordering::SeqCst) - 1;
        }
    }
    Ok(modes
        .iter()
        .zip(samples)
        .map(|((mode, _), mut sample)| {
            let (p50, p99) = percentiles(&mut sample.latency);
            WakeRow {
                store: name,
                mode,
                p50,
                p99,
                complete: percentiles(&mut sample.complete),
                after: percentiles(&mut sample.after),
                reads: sample.reads as f64 / trials as f64,
                lost: sample.lost,
            }
        })
        .collect())
}

/// One row's measurements.
#[derive(Debug, Clone, Default)]
struct Samples {
    latency: Vec<Duration>,
    complete: Vec<Duration>,
    after: Vec<Duration>,
    reads: usize,
    lost: usize,
}

/// p50 and p99 of `durations`.
fn percentiles(durations: &mut [Duration]) -> (Duration, Duration) {
    durations.sort();
    let at = |q: f64| {
        durations
            .get(((durations.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    (at(0.5), at(0.99))
}

/// Prints the rows as a table.
pub(crate) fn print(rows: &[WakeRow], trials: usize) {
    println!("wake-up latency, owner's complete → waiter returns ({trials} trials per row)");
    println!(
        "{:<10} {:<9} {:>10} {:>10} {:>14} {:>5} {:>17} {:>17}",
        "store",
        "mode",
        "p50 ms",
        "p99 ms",
        "reads/waiter",
        "lost",
        "complete p50/p99",
        "after p50/p99"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for row in rows {
        println!(
            "{:<10} {:<9} {:>10.2} {:>10.2} {:>14.1} {:>5} {:>8.2}/{:<8.2} {:>8.2}/{:<8.2}",
            row.store,
            row.mode,
            ms(row.p50),
            ms(row.p99),
            row.reads,
            row.lost,
            ms(row.complete.0),
            ms(row.complete.1),
            ms(row.after.0),
            ms(row.after.1),
        );
    }
}

/// The wake-up table of `BENCHMARKS.md`: per store and mode, how long a
/// waiter takes to return after the owner's `complete`, and the store
/// reads it made.
pub(crate) fn markdown(rows: &[WakeRow]) -> String {
    let mut table = crate::markdown::Table::new(&[
        "store",
        "waiter",
        ">p50 ms",
        ">p99 ms",
        ">reads per waiter",
        ">lost",
    ]);
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e3);
    for row in rows {
        table.row(vec![
            row.store.to_owned(),
            row.mode.to_owned(),
            ms(row.p50),
            ms(row.p99),
            format!("{:.1}", row.reads),
            row.lost.to_string(),
        ]);
    }
    table.render()
}

/// Opens every store asked for (through the same per-store modules as the
/// other binaries, PostgreSQL with notifications on), measures it and
/// removes what it made. A store whose server does not answer is skipped
/// with the reason, which is returned.
pub(crate) async fn run(
    stores: &[StoreKind],
    places: Places<'_>,
    tag: &str,
    trials: usize,
) -> Result<(Vec<WakeRow>, Vec<String>), BoxError> {
    let places = Places {
        postgres_notifications: true,
        ..places
    };
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for &kind in stores {
        let target = match target::open(kind, places, &format!("{tag}_wake")).await? {
            Opened::Target(target) => target,
            Opened::Skipped(url, reason) => {
                let line = format!(
                    "{} at {url} is unreachable ({reason}); skipped",
                    kind.name()
                );
                eprintln!("idem-bench: {line}");
                skipped.push(line);
                continue;
            }
        };
        let measured = measure(target.name(), target.store(), tag, trials).await;
        let removed = target.remove_all().await;
        rows.extend(measured?);
        removed?;
    }
    Ok((rows, skipped))
}
