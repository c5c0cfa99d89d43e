//! A storm of calls that counts what a fault did to it: callers that each
//! run fresh keys one after another, retrying a key after a store error
//! until they are told its outcome, and a ledger of every run of the work.
//! A test injects its fault while the storm runs, then [`Storm::finish`]
//! replays every outcome a caller was told and counts what was lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{Error, Idempotent, When};
use tokio::task::JoinHandle;

/// What one storm saw.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    /// Keys the callers started.
    pub keys: usize,
    /// Keys whose outcome a caller was told.
    pub told: usize,
    /// Runs of the work beyond the first, over every key.
    pub second_runs: usize,
    /// Told outcomes that did not replay afterwards (or ran the work).
    pub lost_outcomes: usize,
    /// Store errors that said the work had not run.
    pub errors_before_work: usize,
    /// Store errors that said the work had run.
    pub errors_after_work: usize,
    /// Keys a caller left because another call held them.
    pub in_flight: usize,
    /// Calls told `LeaseLost`: the work ran, and the record of its claim
    /// was taken over or is gone (lost in a failover), so its outcome was
    /// not recorded. The caller leaves the key.
    pub leases_lost: usize,
    /// Store errors whose `When` was wrong: `BeforeWork` from an attempt
    /// that ran the work, or `AfterWork` from one that did not.
    pub wrong_when: usize,
    /// Outcomes told after [`Storm::fault_ended`].
    pub told_after_fault: usize,
}

impl Figures {
    /// Panics, with the figures, unless more than `at_least` outcomes were
    /// told and every store error's `When` was true.
    pub fn assert_told_truly(&self, at_least: usize) {
        assert!(self.told > at_least, "too few outcomes told: {self:?}");
        assert_eq!(
            self.wrong_when, 0,
            "an error said the wrong thing: {self:?}"
        );
    }

    /// [`assert_told_truly`](Figures::assert_told_truly), and no key ran
    /// twice and no told outcome was lost.
    pub fn assert_safe(&self, at_least: usize) {
        self.assert_told_truly(at_least);
        assert_eq!(
            self.second_runs, 0,
            "a key ran twice under its lease: {self:?}"
        );
        assert_eq!(self.lost_outcomes, 0, "a told outcome was lost: {self:?}");
    }
}

/// Runs `storm` as many times as the environment variable `variable` says
/// (default 1), printing each trial's figures under `what` and checking
/// them with `check`; stops at a storm that skipped (returned `None`).
pub async fn trials<F>(
    variable: &str,
    what: &str,
    mut storm: impl FnMut() -> F,
    check: impl Fn(&Figures),
) where
    F: std::future::Future<Output = Option<Figures>>,
{
    let trials = std::env::var(variable)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for trial in 1..=trials {
        let Some(figures) = storm().await else {
            return;
        };
        eprintln!("{what}, trial {trial}: {figures:?}");
        check(&figures);
    }
}

#[derive(Debug, Default)]
struct State {
    stop: AtomicBool,
    fault_ended: AtomicBool,
    told_count: AtomicUsize,
    told_after: AtomicUsize,
    refused: AtomicUsize,
    runs: Mutex<HashMap<String, usize>>,
    told: Mutex<HashMap<String, String>>,
    figures: Mutex<Figures>,
}

/// A storm of calls running on the current tokio runtime.
#[derive(Debug)]
pub struct Storm {
    idem: Idempotent,
    state: Arc<State>,
    callers: Vec<JoinHandle<()>>,
}

impl Storm {
    /// Starts `callers` callers on `idem`. Any error but a store error, a
    /// key in flight or a lost lease fails the caller, and
    /// [`Storm::finish`] with it.
    pub fn start(idem: &Idempotent, callers: usize) -> Storm {
        let state = Arc::new(State::default());
        let callers = (0..callers)
            .map(|caller| tokio::spawn(call(idem.clone(), caller, state.clone())))
            .collect();
        Storm {
            idem: idem.clone(),
            state,
            callers,
        }
    }

    /// Outcomes told so far.
    pub fn told(&self) -> usize {
        self.state.told_count.load(Ordering::SeqCst)
    }

    /// Store errors so far.
    pub fn refused(&self) -> usize {
        self.state.refused.load(Ordering::SeqCst)
    }

    /// Blocks (call it under `block_in_place`) until `count` reaches
    /// `at_least`, or panics with `what` after 30 s.
    pub fn wait(&self, count: impl Fn(&Storm) -> usize, at_least: usize, what: &str) {
        if !self.reached(&count, at_least) {
            panic!("{what}: {}", count(self));
        }
    }

    /// Blocks (call it under `block_in_place`) until `count` reaches
    /// `at_least` (`true`) or 30 s have passed (`false`).
    pub fn reached(&self, count: impl Fn(&Storm) -> usize, at_least: usize) -> bool {
        let give_up = Instant::now() + Duration::from_secs(30);
        while count(self) < at_least {
            if Instant::now() >= give_up {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Marks the fault over (the failover done, the space freed): outcomes
    /// told from now on are counted in [`Figures::told_after_fault`].
    pub fn fault_ended(&self) {
        self.state.fault_ended.store(true, Ordering::SeqCst);
    }

    /// Outcomes told since [`Storm::fault_ended`].
    pub fn told_after_fault(&self) -> usize {
        self.state.told_after.load(Ordering::SeqCst)
    }

    /// Stops the callers, then calls every told key again: a call that runs
    /// the work or answers another outcome is a lost outcome.
    pub async fn finish(self) -> Figures {
        self.state.stop.store(true, Ordering::SeqCst);
        for caller in self.callers {
            caller.await.expect("a caller of the storm failed");
        }
        let state = &self.state;
        let told = state.told.lock().unwrap().clone();
        let mut figures = state.figures.lock().unwrap().clone();
        figures.told = told.len();
        figures.told_after_fault = state.told_after.load(Ordering::SeqCst);
        figures.second_runs = state
            .runs
            .lock()
            .unwrap()
            .values()
            .map(|runs| runs.saturating_sub(1))
            .sum();
        for (key, outcome) in &told {
            let ran = Arc::new(AtomicBool::new(false));
            let ran_here = ran.clone();
            let replay: Result<String, Error<String>> = self
                .idem
                .execute(key, key, || async move {
                    ran_here.store(true, Ordering::SeqCst);
                    Ok("run again".to_owned())
                })
                .await;
            if ran.load(Ordering::SeqCst) || replay.as_ref().ok() != Some(outcome) {
                figures.lost_outcomes += 1;
            }
        }
        figures
    }
}

async fn call(idem: Idempotent, caller: usize, state: Arc<State>) {
    let mut n = 0;
    while !state.stop.load(Ordering::SeqCst) {
        n += 1;
        let key = format!("c{caller}-{n}");
        state.figures.lock().unwrap().keys += 1;
        // The same key until it is told an outcome, or is left in flight.
        loop {
            let (ledger, run_key) = (state.clone(), key.clone());
            let ran = Arc::new(AtomicBool::new(false));
            let ran_here = ran.clone();
            let out: Result<String, Error<String>> = idem
                .execute(&key, &key, || async move {
                    ran_here.store(true, Ordering::SeqCst);
                    *ledger
                        .runs
                        .lock()
                        .unwrap()
                        .entry(run_key.clone())
                        .or_default() += 1;
                    Ok(format!("outcome of {run_key}"))
                })
                .await;
            match out {
                Ok(outcome) => {
                    state.told.lock().unwrap().insert(key.clone(), outcome);
                    state.told_count.fetch_add(1, Ordering::SeqCst);
                    if state.fault_ended.load(Ordering::SeqCst) {
                        state.told_after.fetch_add(1, Ordering::SeqCst);
                    }
                    break;
                }
                Err(Error::Store { when, .. }) => {
                    let mut figures = state.figures.lock().unwrap();
                    let before = when == When::BeforeWork;
                    if before {
                        figures.errors_before_work += 1;
                    } else {
                        figures.errors_after_work += 1;
                    }
                    if before == ran.load(Ordering::SeqCst) {
                        figures.wrong_when += 1;
                    }
                    state.refused.fetch_add(1, Ordering::SeqCst);
                }
                Err(Error::InProgress { .. }) => {
                    state.figures.lock().unwrap().in_flight += 1;
                    break;
                }
                Err(Error::LeaseLost) => {
                    state.figures.lock().unwrap().leases_lost += 1;
                    break;
                }
                Err(other) => panic!("{key}: {other}"),
            }
            if state.stop.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
