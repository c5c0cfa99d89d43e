//! Resetting a settled key: an operator's step, audited and counted.

use tracing::Instrument;

use crate::observe::TracedKey;
use crate::store::{Reset, State, Store};
use crate::{Error, Idempotent, When};

impl Idempotent {
    /// Deletes the recorded outcome of `key` (in this handle's namespace
    /// and scope), so that the next call with the key runs the work again,
    /// whatever its body. For an operator who knows a recorded outcome is
    /// wrong: a remembered failure whose cause is fixed, an outcome recorded
    /// by a bug. The command line does the same with `idem reset KEY`.
    ///
    /// Only a settled record (`Completed` or `Failed`) is deleted, in one
    /// atomic step of the store, and the answer says what was found
    /// ([`Reset::Deleted`] with its state). A key in flight is refused
    /// with [`Reset::InFlight`] and left alone, even when its lease has
    /// lapsed: its owner may be running the work, and only the owner's
    /// token may release it (`idem release --token`, or the next caller's
    /// takeover once the lease lapses). A key with no live record is
    /// [`Reset::Absent`]. A reset deletes rather than rewrites, so no
    /// token the record held changes anything afterwards: a stale owner's
    /// late completion gets [`Error::LeaseLost`], never over the next
    /// caller's record.
    ///
    /// Each reset writes one audit line (target `idem::audit`, with the key
    /// hashed as [`KeyInTraces`](crate::observe::KeyInTraces) says; see
    /// [`observe`](crate::observe)) and counts `idem_resets_total` by
    /// outcome. [`reset_because`](Idempotent::reset_because) adds who asked
    /// and why.
    ///
    /// A cache in front of the store in *another* process (a near cache of
    /// settled records) does not hear of the reset: it may replay the old
    /// outcome until its entry lapses, at most its cap (60 s by default).
    /// A store failure is [`Error::Store`] with [`When::BeforeWork`] (no
    /// work runs in a reset); whether the delete took effect is then
    /// unknown, and `idem inspect` tells.
    ///
    /// ```
    /// use idem_core::store::{Reset, State};
    /// use idem_core::{Idempotent, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let idem = Idempotent::new(MemoryStore::new());
    /// let first: u32 = idem.execute("k", "body", || async { Ok::<_, ()>(1) }).await.unwrap();
    /// assert_eq!(idem.reset("k").await.unwrap(), Reset::Deleted(State::Completed));
    /// let again: u32 = idem.execute("k", "body", || async { Ok::<_, ()>(2) }).await.unwrap();
    /// assert_eq!((first, again), (1, 2));
    /// assert_eq!(idem.reset("never-used").await.unwrap(), Reset::Absent);
    /// # }
    /// ```
    pub async fn reset(&self, key: &str) -> Result<Reset, Error> {
        self.reset_audited(key, None).await
    }

    /// [`reset`](Idempotent::reset), with who asked for it (`by`) and why
    /// (`reason`) in its audit line.
    pub async fn reset_because(&self, key: &str, by: &str, reason: &str) -> Result<Reset, Error> {
        self.reset_audited(key, Some((by, reason))).await
    }

    async fn reset_audited(&self, key: &str, audit: Option<(&str, &str)>) -> Result<Reset, Error> {
        let key = self.key(key)?;
        let observed = self.observed_store();
        let observe = &observed.observe;
        let traced = TracedKey(&key, observe.keys);
        let span = tracing::info_span!("idem.reset", namespace = %observe.namespace(),
            key = %traced, outcome = tracing::field::Empty);
        let answer = observed.reset(key.as_str()).instrument(span.clone()).await;
        let (by, reason) = audit.unwrap_or_default();
        let state = match answer {
            Ok(Reset::Deleted(State::Completed)) => "completed",
            Ok(Reset::Deleted(State::Failed)) => "failed",
            _ => "",
        };
        match &answer {
            Ok(reset) => {
                span.record("outcome", reset.as_str());
                tracing::info!(target: "idem::audit", parent: &span,
                store = %observe.store_name(), namespace = %observe.namespace(),
                key = %traced, outcome = reset.as_str(), state, by, reason,
                "idem reset: {}", match reset {
                    Reset::Deleted(_) => "deleted the recorded outcome; the key runs again",
                    Reset::InFlight => "refused: the key is in flight",
                    _ => "nothing to delete: no live record",
                });
            }
            Err(error) => {
                span.record("outcome", "error");
                tracing::warn!(target: "idem::audit", parent: &span,
                    store = %observe.store_name(), namespace = %observe.namespace(),
                    key = %traced, outcome = "error", by, reason, %error,
                    "idem reset: the store failed; whether the record was deleted is unknown");
            }
        }
        answer.map_err(|source| Error::store(source, When::BeforeWork))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;
    use crate::{Begin, Fingerprint, MemoryStore};

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Resets in two scopes, counted: only the settled record of the scope
    /// asked is deleted and a key in flight is refused and kept. (The audit
    /// line is checked end to end by `idem-cli`'s test, on every store.)
    #[test]
    fn resets_are_audited_counted_and_scoped() {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = Arc::new(MemoryStore::new());
        let idem = Idempotent::new(Arc::clone(&store)).with_namespace("resets");
        let (a, b) = (idem.scoped("tenant-a"), idem.scoped("tenant-b"));
        let _guard = tracing::subscriber::set_default(subscriber);
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                for scoped in [&a, &b] {
                    let _: u8 = scoped
                        .execute("order-1", "body", || async { Ok::<_, ()>(1) })
                        .await
                        .unwrap();
                }
                let held = a.begin("held", Fingerprint::of_bytes(b"x")).await.unwrap();
                assert!(matches!(held, Begin::Run(_)));

                assert_eq!(
                    a.reset_because("order-1", "ops", "refund reissued")
                        .await
                        .unwrap(),
                    Reset::Deleted(State::Completed)
                );
                assert_eq!(a.reset("held").await.unwrap(), Reset::InFlight);
                assert_eq!(a.reset("order-1").await.unwrap(), Reset::Absent);
                assert!(matches!(
                    a.reset("bad key").await,
                    Err(Error::InvalidKey(_))
                ));

                let kept = b.key("order-1").unwrap();
                assert!(store.load(kept.as_str()).await.unwrap().is_some());
                let held = a.key("held").unwrap();
                let record = store.load(held.as_str()).await.unwrap().unwrap();
                assert_eq!(record.state, State::InFlight);
                let again: u8 = a
                    .execute("order-1", "body", || async { Ok::<_, ()>(2) })
                    .await
                    .unwrap();
                assert_eq!(again, 2, "a reset key runs its work again");
            })
        });

        let mut counted = Vec::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            if key.name() != "idem_resets_total" {
                continue;
            }
            let outcome = key
                .labels()
                .find(|l| l.key() == "outcome")
                .map(|l| l.value().to_owned())
                .unwrap();
            let DebugValue::Counter(n) = value else {
                panic!("idem_resets_total is a counter");
            };
            counted.push((outcome, n));
        }
        counted.sort();
        assert_eq!(
            counted,
            [("absent", 1), ("deleted", 1), ("in_flight", 1)].map(|(o, n)| (o.to_owned(), n))
        );
    }

    /// A reset deletes, so an owner whose lease was taken over cannot land
    /// its outcome after the heir completed and the key was reset, nor over
    /// the next claim.
    #[tokio::test(start_paused = true)]
    async fn a_stale_owner_cannot_complete_after_a_reset() {
        let idem = Idempotent::new(MemoryStore::new()).with_lease(Duration::from_secs(1));
        let fingerprint = Fingerprint::of_bytes(b"x");
        let Begin::Run(stale) = idem.begin("k", fingerprint).await.unwrap() else {
            panic!("the first claim runs");
        };
        tokio::time::advance(Duration::from_secs(2)).await;
        let Begin::Run(heir) = idem.begin("k", fingerprint).await.unwrap() else {
            panic!("the lapsed lease is taken over");
        };
        heir.complete(b"1").await.unwrap();
        assert_eq!(
            idem.reset("k").await.unwrap(),
            Reset::Deleted(State::Completed)
        );
        assert!(matches!(stale.complete(b"2").await, Err(Error::LeaseLost)));
        assert!(matches!(heir.complete(b"3").await, Err(Error::LeaseLost)));
        let Begin::Run(next) = idem.begin("k", fingerprint).await.unwrap() else {
            panic!("a reset key is claimed again");
        };
        assert!(matches!(stale.complete(b"2").await, Err(Error::LeaseLost)));
        next.complete(b"4").await.unwrap();
        let Begin::Replay(replay) = idem.begin("k", fingerprint).await.unwrap() else {
            panic!("the new outcome replays");
        };
        assert_eq!(replay.payload(), b"4");
    }
}
