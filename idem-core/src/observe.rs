//! Metrics and tracing: what an operator sees of idem at run time.
//!
//! # Metrics
//!
//! Recorded through the [`metrics`] facade, so the exporter (Prometheus,
//! StatsD, …) is the application's choice; with no recorder installed each
//! one costs a check of the facade's no-op path. Every metric is labelled
//! `store` (such as `sqlite`, `redis`, `postgres`, `mysql`, `memory`; see
//! [`Idempotent::with_store_name`](crate::Idempotent::with_store_name)) and
//! `namespace`, **never by key**: keys are unbounded and may name tenants.
//!
//! | metric | kind | when |
//! |---|---|---|
//! | `idem_executed_total` | counter | a caller got the key and runs the work (a fresh claim or a takeover) |
//! | `idem_replayed_total` | counter | a recorded outcome (success or remembered failure) was replayed |
//! | `idem_mismatch_total` | counter | the key was used with another request |
//! | `idem_in_progress_total` | counter | a caller found a live lease and gave up (409) |
//! | `idem_taken_over_total` | counter | a lapsed lease was taken over |
//! | `idem_completed_total` | counter | an outcome was recorded |
//! | `idem_failures_remembered_total` | counter | a failure was recorded to be replayed |
//! | `idem_released_total` | counter | a key was given back after the work failed |
//! | `idem_lease_lost_total` | counter | an owner's complete, fail, release or renewal found its lease taken over |
//! | `idem_store_errors_total` | counter | a store call failed; labels `op`, `kind` (`backend`, `corrupt`, `config`) and `work` |
//! | `idem_store_call_seconds` | histogram | every store call; label `op` |
//! | `idem_work_seconds` | histogram | the work, from the claim's answer to its end |
//! | `idem_purged_total` | counter | records deleted by [`spawn_purger`](crate::store::spawn_purger) |
//! | `idem_purge_errors_total` | counter | a purge that failed |
//! | `idem_resets_total` | counter | an operator's reset of a key ([`Idempotent::reset`](crate::Idempotent::reset), `idem reset`); label `outcome`: `deleted`, `in_flight` (refused) or `absent` |
//!
//! The `work` label of a store error says whether the work had run, as
//! [`When`](crate::When) does: `before` for a claim or takeover (`insert`,
//! `take_over`), `during` for a lease renewal, `after` for `complete`,
//! `fail` and `release`, and `none` for calls outside a request (`load`,
//! `purge_expired`, `reset`).
//!
//! # Tracing
//!
//! `execute` runs in a span `idem.execute` and the begin API in a span
//! `idem.begin`, each with the fields `namespace`, `key` and `decision`
//! (`executed`, `taken_over`, `replayed`, `mismatch`, `in_progress`). Every
//! store call runs in a span `idem.store` with `store`, `op` and
//! `outcome`. The key appears only as [`KeyInTraces`] says: by default a
//! short hash, so traces and logs never carry a tenant's key or scope.
//!
//! Every reset writes one audit line, an `INFO` event with target
//! `idem::audit`: `store`, `namespace`, `key` (as [`KeyInTraces`] says),
//! `outcome` (`deleted`, `in_flight`, `absent`), `state` (what was
//! deleted) and, when the caller gave them
//! ([`Idempotent::reset_because`](crate::Idempotent::reset_because), `idem
//! reset --by … --reason …`), `by` and `reason`. Keep that target at
//! `INFO` where audit matters.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Key as MetricKey, Label, Level, Metadata, SharedString};
use sha2::{Digest, Sha256};
use tracing::Instrument;

use crate::store::{Reset, StoreError, StoreErrorKind};
use crate::Key;

mod store;
pub(crate) use store::{store_name, ObservedStore};

/// How a key appears in spans and log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyInTraces {
    /// The first 8 bytes of the SHA-256 of the whole stored key
    /// (namespace, scope and client key), as 16 hex digits: the same key
    /// always gives the same hash, so an operator can follow one key
    /// through the logs and match it with `idem inspect`, but nothing of
    /// the key or the tenant can be read from it. The default.
    #[default]
    Hash,
    /// The client key as the caller sent it (never the scope). Choose it
    /// when client keys are random and carry no tenant data.
    ClientKey,
}

/// The short hash of a stored key that [`KeyInTraces::Hash`] shows: 16 hex
/// digits. `idem inspect` prints it too.
pub fn key_hash(stored_key: &str) -> String {
    let digest = Sha256::digest(stored_key.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A key as traces show it; formatted only when a subscriber records it.
pub(crate) struct TracedKey<'a>(pub(crate) &'a Key, pub(crate) KeyInTraces);

impl fmt::Display for TracedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            KeyInTraces::Hash => f.write_str(&key_hash(self.0.as_str())),
            KeyInTraces::ClientKey => f.write_str(self.0.client_key()),
        }
    }
}

/// The counters a handle adds to on its common path, by name; their keys
/// are built once per handle (see [`MetricKeys`]).
const COUNTERS: [&str; 9] = [
    "idem_executed_total",
    "idem_replayed_total",
    "idem_mismatch_total",
    "idem_in_progress_total",
    "idem_completed_total",
    "idem_failures_remembered_total",
    "idem_lease_lost_total",
    "idem_taken_over_total",
    "idem_released_total",
];

/// The `op` label of `idem_store_call_seconds`, one per store call.
const OPS: [&str; 9] = [
    "insert",
    "renew",
    "complete",
    "fail",
    "take_over",
    "release",
    "load",
    "purge_expired",
    "reset",
];

/// What the `metrics` macros attach to every metric they register.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The metric keys of one handle (name and labels, with the labels' hash),
/// built when the handle is: each call then only asks the recorder that is
/// current *at that call* for the metric, as the `metrics` macros do, so a
/// recorder installed later (or a thread-local one) still gets everything.
/// Building the key on each call (label vector, hashing) was most of what a
/// replay spent on metrics when no recorder is installed.
#[derive(Debug)]
struct MetricKeys {
    counters: [MetricKey; COUNTERS.len()],
    work: MetricKey,
    calls: [MetricKey; OPS.len()],
}

impl MetricKeys {
    fn new(labels: &[Label]) -> MetricKeys {
        let with_op = |op: &'static str| -> Vec<Label> {
            labels
                .iter()
                .cloned()
                .chain([Label::new("op", op)])
                .collect()
        };
        MetricKeys {
            counters: COUNTERS.map(|name| MetricKey::from_parts(name, labels.to_vec())),
            work: MetricKey::from_parts("idem_work_seconds", labels.to_vec()),
            calls: OPS.map(|op| MetricKey::from_parts("idem_store_call_seconds", with_op(op))),
        }
    }
}

/// The labels and settings every metric and span of one handle carries.
#[derive(Debug, Clone)]
pub(crate) struct Observe {
    store: Arc<str>,
    namespace: Arc<str>,
    pub(crate) keys: KeyInTraces,
    metric_keys: Arc<MetricKeys>,
}

impl Observe {
    pub(crate) fn new(store: Arc<str>, namespace: Arc<str>, keys: KeyInTraces) -> Observe {
        let labels = [
            Label::new("store", SharedString::from(Arc::clone(&store))),
            Label::new("namespace", SharedString::from(Arc::clone(&namespace))),
        ];
        Observe {
            metric_keys: Arc::new(MetricKeys::new(&labels)),
            store,
            namespace,
            keys,
        }
    }

    pub(crate) fn store_name(&self) -> &str {
        &self.store
    }

    fn labels(&self) -> Vec<Label> {
        vec![
            Label::new("store", SharedString::from(Arc::clone(&self.store))),
            Label::new("namespace", SharedString::from(Arc::clone(&self.namespace))),
        ]
    }

    fn with(&self, extra: &[(&'static str, &'static str)]) -> Vec<Label> {
        let mut labels = self.labels();
        labels.extend(extra.iter().map(|&(k, v)| Label::new(k, v)));
        labels
    }

    /// Adds one to the counter `name`.
    pub(crate) fn count(&self, name: &'static str) {
        match COUNTERS.iter().position(|&known| known == name) {
            Some(at) => {
                let key = &self.metric_keys.counters[at];
                metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
                    .increment(1);
            }
            None => metrics::counter!(name, self.labels()).increment(1),
        }
    }

    /// Records `took` in the histogram under `key`.
    fn record(key: &MetricKey, took: Duration) {
        metrics::with_recorder(|recorder| recorder.register_histogram(key, &METADATA))
            .record(took.as_secs_f64());
    }

    /// Counts a decision on a claim and records it on the current span.
    pub(crate) fn decided(&self, decision: &'static str) {
        record_on_current("decision", decision);
        let name = match decision {
            "executed" => "idem_executed_total",
            "replayed" => "idem_replayed_total",
            "mismatch" => "idem_mismatch_total",
            "in_progress" => "idem_in_progress_total",
            _ => return,
        };
        self.count(name);
    }

    /// Counts a reset by what it found.
    pub(crate) fn reset(&self, reset: Reset) {
        metrics::counter!(
            "idem_resets_total",
            self.with(&[("outcome", reset.as_str())])
        )
        .increment(1);
    }

    /// The namespace label.
    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Records how long the work ran.
    pub(crate) fn worked(&self, took: Duration) {
        Self::record(&self.metric_keys.work, took);
    }

    /// A span for one `execute` or `begin`.
    pub(crate) fn span(&self, name: &'static str, key: &Key) -> tracing::Span {
        let key = TracedKey(key, self.keys);
        traced(tracing::Level::INFO, || match name {
            "idem.execute" => tracing::info_span!("idem.execute",
                namespace = %self.namespace, key = %key, decision = tracing::field::Empty),
            _ => tracing::info_span!("idem.begin",
                namespace = %self.namespace, key = %key, decision = tracing::field::Empty),
        })
    }

    /// Runs one store call in a span, timing it and counting its failure.
    async fn call<T, F>(&self, op: &'static str, work: &'static str, call: F) -> F::Output
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let span = traced(tracing::Level::DEBUG, || {
            tracing::debug_span!("idem.store", store = %self.store, op,
            outcome = tracing::field::Empty)
        });
        let started = Instant::now();
        let answer = call.instrument(span.clone()).await;
        let took = started.elapsed();
        match OPS.iter().position(|&known| known == op) {
            Some(at) => Self::record(&self.metric_keys.calls[at], took),
            None => metrics::histogram!("idem_store_call_seconds", self.with(&[("op", op)]))
                .record(took.as_secs_f64()),
        }
        if let Err(error) = &answer {
            span.record("outcome", "error");
            let kind = match error.kind() {
                StoreErrorKind::Backend => "backend",
                StoreErrorKind::Corrupt => "corrupt",
                StoreErrorKind::Config => "config",
            };
            metrics::counter!(
                "idem_store_errors_total",
                self.with(&[("op", op), ("kind", kind), ("work", work)])
            )
            .increment(1);
        }
        answer
    }
}

/// Whether a span or event at `level` can be enabled at all: the test
/// `tracing`'s own macros make first. With no subscriber set, or none
/// that wants `level`, it is false.
pub(crate) fn may_trace(level: tracing::Level) -> bool {
    use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
    level <= STATIC_MAX_LEVEL && level <= LevelFilter::current()
}

/// Records `field` on the current span. Where no subscriber wants any
/// span there is no span to record on, and looking for one is not free.
pub(crate) fn record_on_current(field: &'static str, value: &'static str) {
    if may_trace(tracing::Level::ERROR) {
        tracing::Span::current().record(field, value);
    }
}

/// The span `make` makes at `level`, or no span at all when nothing
/// listens for it: no subscriber wants `level`, or the one set does not
/// want this span. A disabled span still costs its making and, with
/// `tracing`'s `log` feature on, a look at the `log` crate on every
/// poll; so idem's spans reach a subscriber, and not the `log` bridge
/// (idem's events still do).
pub(crate) fn traced(level: tracing::Level, make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if !may_trace(level) {
        return tracing::Span::none();
    }
    let span = make();
    if span.is_disabled() {
        tracing::Span::none()
    } else {
        span
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[test]
    fn key_hashes_are_stable_and_hide_the_key() {
        let key = Key::new("ns", "tenant-a", "order-1").unwrap();
        let hash = key_hash(key.as_str());
        assert_eq!(hash.len(), 16);
        assert_eq!(hash, key_hash(key.as_str()));
        assert!(!hash.contains("order"));
        let other = Key::new("ns", "tenant-b", "order-1").unwrap();
        assert_ne!(hash, key_hash(other.as_str()));
        assert_eq!(
            TracedKey(&key, KeyInTraces::ClientKey).to_string(),
            "order-1"
        );
    }

    /// The keys are built with the handle, but the recorder is asked for at
    /// each call: one set up after the handle was built (here a thread-local
    /// one) sees every count and timing, under the handle's labels.
    #[test]
    fn a_recorder_set_up_after_the_handle_is_built_counts_its_calls() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        let idem = crate::Idempotent::new(MemoryStore::new()).with_namespace("late-recorder");
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                for _ in 0..3 {
                    let n: u32 = idem
                        .execute("k", "body", || async { Ok::<_, ()>(7) })
                        .await
                        .unwrap();
                    assert_eq!(n, 7);
                }
            })
        });
        let mut seen = Vec::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            assert!(
                labels.contains(&("namespace".to_owned(), "late-recorder".to_owned()))
                    && labels.contains(&("store".to_owned(), "memory".to_owned())),
                "{} has labels {labels:?}",
                key.name()
            );
            let op = labels
                .iter()
                .find(|(k, _)| k == "op")
                .map(|(_, v)| v.clone());
            let n = match value {
                DebugValue::Counter(n) => n as usize,
                DebugValue::Histogram(samples) => samples.len(),
                DebugValue::Gauge(_) => continue,
            };
            seen.push((key.name().to_owned(), op, n));
        }
        seen.sort();
        let expected = [
            ("idem_completed_total", None, 1),
            ("idem_executed_total", None, 1),
            ("idem_replayed_total", None, 2),
            ("idem_store_call_seconds", Some("complete"), 1),
            ("idem_store_call_seconds", Some("insert"), 3),
            ("idem_work_seconds", None, 1),
        ]
        .map(|(name, op, n)| (name.to_owned(), op.map(str::to_owned), n));
        assert_eq!(seen, expected);
    }
}
