//! Plays one schedule against a fresh fixture and collects what broke.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_core::store::{Record, State, Store};
use idem_core::{Begin, Error, Fingerprint, Idempotent};
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::check::{violations, Answer, Evidence, Run};
use super::recorder::{Op, Recorder, CALLER};
use super::schedule::{self, Act, Caller, Schedule};
use crate::settings::Interleavings;
use crate::support::{NAMESPACE, POLL};

/// How long a schedule's callers may take before the schedule counts as
/// hung.
const HUNG: Duration = Duration::from_secs(30);

/// How long past a lease a key left in flight may take to be recovered.
const RECOVERY: Duration = Duration::from_secs(1);

type Runs = Arc<Mutex<Vec<Run>>>;

/// What playing one schedule found.
pub(super) struct Played {
    /// Every broken invariant.
    pub(super) violations: Vec<String>,
    /// Times the work started.
    pub(super) executions: u64,
}

/// Plays `schedule` on `store` under the key prefix (namespace) `name`,
/// which no other play on this store uses, with the lease and time scale
/// of `settings`.
pub(super) async fn schedule(
    store: Arc<dyn Store>,
    schedule: &Schedule,
    settings: &Interleavings,
    name: &str,
) -> Played {
    let namespace = format!("{NAMESPACE}-{name}");
    let recorder = Arc::new(Recorder::new(Arc::clone(&store)));
    let idem = Idempotent::from_arc(recorder.clone())
        .with_lease(settings.lease)
        .with_namespace(&namespace);
    let keys: Vec<String> = (0..3u8)
        .map(|k| match idem.key(&format!("interleaved-{k}")) {
            Ok(key) => key.as_str().to_owned(),
            Err(e) => panic!("the kit built an invalid key: {e}"),
        })
        .collect();

    let runs: Runs = Arc::default();
    let began = Instant::now();
    let mut tasks = JoinSet::new();
    for (index, caller) in schedule.callers.iter().cloned().enumerate() {
        let (idem, runs, t) = (idem.clone(), Arc::clone(&runs), settings.clone());
        tasks.spawn(CALLER.scope(index, async move {
            tokio::time::sleep_until(began + t.at(caller.start_ms)).await;
            (index, play(&idem, &t, index, &caller, &runs).await)
        }));
    }
    let mut answers = vec![Answer::Unexpected("no answer".to_owned()); schedule.callers.len()];
    let mut found = Vec::new();
    let collected = tokio::time::timeout(HUNG, async {
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((index, answer)) => answers[index] = answer,
                Err(e) => found.push(format!("a caller panicked: {e}")),
            }
        }
    })
    .await;
    let executions = runs.lock().unwrap_or_else(PoisonError::into_inner).len() as u64;
    let played = |violations| Played {
        violations,
        executions,
    };
    if collected.is_err() {
        return played(vec![format!("the callers did not finish within {HUNG:?}")]);
    }

    let mut finals = Vec::new();
    for key in &keys {
        match store.load(key).await {
            Ok(record) => finals.push(record),
            Err(e) => return played(vec![format!("load failed after the schedule: {e}")]),
        }
    }
    let ops = recorder.ops();
    let runs = runs.lock().unwrap_or_else(PoisonError::into_inner).clone();
    found.extend(violations(&Evidence {
        schedule,
        keys: &keys,
        answers: &answers,
        runs: &runs,
        ops: &ops,
        finals: &finals,
    }));
    if found.is_empty() {
        let after = Idempotent::from_arc(Arc::clone(&store))
            .with_lease(settings.lease)
            .with_namespace(&namespace);
        for (k, last) in finals.iter().enumerate() {
            if let Some(record) = last {
                let late = Late {
                    store: &*store,
                    key: &keys[k],
                    ops: &ops,
                };
                found.extend(afterwards(&after, k, record, &late).await);
            }
        }
    }
    played(found)
}

/// Notes that `caller`'s work started on `key`.
fn started(runs: &Runs, caller: usize, key: u8) {
    let run = Run {
        caller,
        key,
        start: Instant::now(),
    };
    runs.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(run);
}

/// How long a retrying caller waits after being told "in progress", in
/// milliseconds against the 150 ms base lease.
const RETRY_AFTER_MS: u16 = 60;

/// One caller's part of the schedule: calls, and calls again while told
/// the key is in progress and it has retries left.
async fn play(
    idem: &Idempotent,
    t: &Interleavings,
    index: usize,
    caller: &Caller,
    runs: &Runs,
) -> Answer {
    let mut retries = caller.retries;
    loop {
        match attempt(idem, t, index, caller, runs).await {
            Answer::InProgress if retries > 0 => {
                retries -= 1;
                tokio::time::sleep(t.at(RETRY_AFTER_MS)).await;
            }
            answer => return answer,
        }
    }
}

async fn attempt(
    idem: &Idempotent,
    t: &Interleavings,
    index: usize,
    caller: &Caller,
    runs: &Runs,
) -> Answer {
    let ran = AtomicBool::new(false);
    let result = match caller.act {
        Act::Stall { extra_ms, release } => {
            return stall(idem, t, index, caller, runs, t.at(extra_ms), release).await
        }
        Act::Cancel { after_ms } => {
            let call = execute(idem, t, index, caller, runs, &ran);
            match tokio::time::timeout(t.at(after_ms), call).await {
                Ok(result) => result,
                Err(_) => return Answer::Cancelled,
            }
        }
        _ => execute(idem, t, index, caller, runs, &ran).await,
    };
    let own = ran.load(Ordering::SeqCst);
    match result {
        Ok(value) => Answer::Value { value, own },
        Err(Error::Work(error)) => Answer::Failure { error, own },
        Err(e) => answer_for(e),
    }
}

fn answer_for<E: std::fmt::Debug>(error: Error<E>) -> Answer {
    match error {
        Error::Mismatch => Answer::Mismatch,
        Error::InProgress { .. } => Answer::InProgress,
        Error::LeaseLost => Answer::LeaseLost,
        other => Answer::Unexpected(format!("{other:?}")),
    }
}

async fn execute(
    idem: &Idempotent,
    t: &Interleavings,
    index: usize,
    caller: &Caller,
    runs: &Runs,
    ran: &AtomicBool,
) -> Result<Value, Error<Value>> {
    let remember = |error: &Value| error["remember"] == true;
    idem.execute_remembering(&caller.client_key(), &caller.body(), remember, || async {
        ran.store(true, Ordering::SeqCst);
        started(runs, index, caller.key);
        tokio::time::sleep(t.at(caller.work_ms)).await;
        match caller.act {
            Act::FailReleased => Err(schedule::failure(index, caller, false)),
            Act::FailRemembered => Err(schedule::failure(index, caller, true)),
            Act::Succeed { pad } => Ok(schedule::outcome(index, caller, pad)),
            _ => Ok(schedule::outcome(index, caller, 0)),
        }
    })
    .await
}

/// A stalled owner: claims through the begin/Lease API, holds the key
/// without a heartbeat past its lease, then tries to complete.
async fn stall(
    idem: &Idempotent,
    t: &Interleavings,
    index: usize,
    caller: &Caller,
    runs: &Runs,
    extra: Duration,
    release: bool,
) -> Answer {
    let fingerprint = match Fingerprint::of_json(&caller.body()) {
        Ok(fingerprint) => fingerprint,
        Err(e) => return Answer::Unexpected(format!("the body does not encode: {e}")),
    };
    let lease = match idem.begin(&caller.client_key(), fingerprint).await {
        Ok(Begin::Run(lease)) => lease,
        Ok(Begin::Replay(replay)) => {
            return match serde_json::from_slice::<Value>(replay.payload()) {
                Ok(error) if replay.is_failure() => Answer::Failure { error, own: false },
                Ok(value) => Answer::Value { value, own: false },
                Err(e) => Answer::Unexpected(format!("a replay does not decode: {e}")),
            }
        }
        Ok(other) => return Answer::Unexpected(format!("{other:?}")),
        Err(e) => return answer_for(e),
    };
    started(runs, index, caller.key);
    tokio::time::sleep(t.lease + extra).await;
    if release {
        return match lease.release().await {
            Ok(()) => Answer::Released,
            Err(e) => answer_for(e),
        };
    }
    let value = schedule::outcome(index, caller, 16);
    let payload = match serde_json::to_vec(&value) {
        Ok(payload) => payload,
        Err(e) => return Answer::Unexpected(format!("the outcome does not encode: {e}")),
    };
    match lease.complete(&payload).await {
        Ok(()) => Answer::Value { value, own: true },
        Err(e) => answer_for(e),
    }
}

/// Once every caller is done: a settled key replays its outcome byte for
/// byte without running the work, and a key left in flight is recovered
/// after its lease (nothing is lost).
async fn afterwards(idem: &Idempotent, k: usize, record: &Record, late: &Late<'_>) -> Vec<String> {
    let Some(body) = (0..2u8)
        .map(schedule::body)
        .find(|body| Fingerprint::of_json(body).ok() == Some(record.fingerprint))
    else {
        return vec![format!("key {k} holds a record for a body nobody sent")];
    };
    let client_key = format!("interleaved-{k}");
    // Every caller is done, so whatever lease is left started before now.
    let give_up = Instant::now() + idem.lease() + RECOVERY;
    loop {
        let ran = AtomicBool::new(false);
        let result = idem
            .execute_remembering(
                &client_key,
                &body,
                |_: &Value| false,
                || async {
                    ran.store(true, Ordering::SeqCst);
                    Ok::<_, Value>(Value::from("recovered"))
                },
            )
            .await;
        let ran = ran.load(Ordering::SeqCst);
        let replayed = match (&result, record.state) {
            (Err(Error::InProgress { .. }), State::InFlight) if Instant::now() < give_up => {
                tokio::time::sleep(POLL).await;
                continue;
            }
            (Ok(_), State::InFlight) if ran => return Vec::new(),
            (Ok(value), State::InFlight) => match late.landed().await {
                Some(landed) if landed.state == State::Completed => {
                    return replays(k, serde_json::to_vec(value), &landed)
                }
                _ => return lost(k, &result),
            },
            (Err(Error::Work(error)), State::InFlight) if !ran => match late.landed().await {
                Some(landed) if landed.state == State::Failed => {
                    return replays(k, serde_json::to_vec(error), &landed)
                }
                _ => return lost(k, &result),
            },
            (Ok(value), State::Completed) if !ran => serde_json::to_vec(value),
            (Err(Error::Work(error)), State::Failed) if !ran => serde_json::to_vec(error),
            (_, State::InFlight) => return lost(k, &result),
            _ => {
                return vec![format!(
                    "key {k}: its {:?} outcome did not replay{} ({result:?})",
                    record.state,
                    if ran { ", the work ran again" } else { "" }
                )]
            }
        };
        return replays(k, replayed, record);
    }
}

fn lost<T: std::fmt::Debug>(k: usize, result: &T) -> Vec<String> {
    vec![format!(
        "key {k} was lost: left in flight, it was not recovered after its lease ({result:?})"
    )]
}

/// Whether the replayed bytes are `record`'s outcome byte for byte.
fn replays(k: usize, replayed: serde_json::Result<Vec<u8>>, record: &Record) -> Vec<String> {
    match replayed {
        Ok(bytes) if bytes == record.payload => Vec::new(),
        _ => vec![format!(
            "key {k}: the replayed outcome is not the stored one byte for byte"
        )],
    }
}

/// What a key's record may become after the schedule: a call whose caller
/// was dropped may still land on a networked store once every caller is
/// done, so a key left in flight may be settled by it.
struct Late<'a> {
    store: &'a dyn Store,
    key: &'a str,
    ops: &'a [Op],
}

impl Late<'_> {
    /// The record under the key now, if it is one that a call still in
    /// doubt asked to write, token, state and payload alike.
    async fn landed(&self) -> Option<Record> {
        let now = self.store.load(self.key).await.ok()??;
        self.ops
            .iter()
            .any(|op| {
                op.key == self.key
                    && op.changed.is_none()
                    && op.written.as_ref().is_some_and(|w| {
                        (w.token, w.state, &w.payload) == (now.token, now.state, &now.payload)
                    })
            })
            .then_some(now)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use idem_core::store::{Insert, NewRecord, Record, Store, StoreError, Token};
    use idem_core::MemoryStore;

    use super::super::schedule::{Act, Caller, Schedule};
    use crate::settings::Interleavings;

    /// A correct store on which a `swap` lands 100 ms after it is sent,
    /// whether or not its caller is still waiting: a statement a server
    /// runs after the client hung up.
    #[derive(Debug, Default)]
    struct SwapsLandLate(Arc<MemoryStore>);

    #[async_trait]
    impl Store for SwapsLandLate {
        async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
            self.0.insert(key, record).await
        }
        async fn swap(
            &self,
            key: &str,
            expected: Token,
            record: &NewRecord<'_>,
        ) -> Result<bool, StoreError> {
            let (store, key, payload) =
                (Arc::clone(&self.0), key.to_owned(), record.payload.to_vec());
            let record = NewRecord {
                payload: &[],
                ..*record
            };
            let landing = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let record = NewRecord {
                    payload: &payload,
                    ..record
                };
                store.swap(&key, expected, &record).await
            });
            landing
                .await
                .unwrap_or_else(|e| panic!("the late swap panicked: {e}"))
        }
        async fn take_over(
            &self,
            key: &str,
            expected: Token,
            record: &NewRecord<'_>,
        ) -> Result<bool, StoreError> {
            self.0.take_over(key, expected, record).await
        }
        async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
            self.0.remove(key, expected).await
        }
        async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
            self.0.load(key).await
        }
        async fn reset(&self, key: &str) -> Result<idem_core::store::Reset, StoreError> {
            self.0.reset(key).await
        }
        async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
            self.0.purge_expired(limit).await
        }
    }

    // Regression: a caller dropped while its completion was on the wire
    // left the key InFlight when the schedule ended; the completion landed
    // afterwards and the key replayed it, which the checker called lost.
    // Found by the soak on PostgreSQL (seed 24, schedule 9842).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_completion_that_lands_after_its_caller_left_is_not_a_lost_key() {
        let schedule = Schedule {
            callers: vec![Caller {
                key: 0,
                body: 0,
                start_ms: 0,
                work_ms: 20,
                retries: 0,
                act: Act::Cancel { after_ms: 60 },
            }],
        };
        let store: Arc<dyn Store> = Arc::new(SwapsLandLate::default());
        let played = super::schedule(store, &schedule, &Interleavings::default(), "late").await;
        assert_eq!(played.executions, 1);
        assert!(played.violations.is_empty(), "{:?}", played.violations);
    }
}
