//! Running the case list: [`run_all`] for one test that runs everything,
//! [`run_each`] for a [`Report`] of what failed.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::settings::{self, Interleavings, SETTINGS};
use crate::Factory;

crate::__with_cases! { __case_table! {} }

/// How many cases [`run_each`] runs at once, each on its own fixture.
const PARALLEL: usize = 16;

type CaseFn = for<'a> fn(&'a dyn Factory) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// One conformance case: a rule and the function that checks it.
#[derive(Clone, Copy)]
pub struct Case {
    group: &'static str,
    name: &'static str,
    run: CaseFn,
}

impl Case {
    #[doc(hidden)]
    pub const fn new(group: &'static str, name: &'static str, run: CaseFn) -> Case {
        Case { group, name, run }
    }

    /// The concern it belongs to: `claim`, `swap`, `fencing`, `expiry`,
    /// `fidelity`, `concurrency`, `execute`, `recovery`, `reset` or
    /// `interleaving`.
    pub fn group(&self) -> &'static str {
        self.group
    }

    /// Its name, a sentence such as `swap_with_a_wrong_token_changes_nothing`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs it on a fixture from `factory`; panics if the rule is broken.
    pub fn run<'a>(&self, factory: &'a dyn Factory) -> impl Future<Output = ()> + Send + 'a {
        (self.run)(factory)
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}::{}", self.group, self.name)
    }
}

/// Every case, in the order of the list.
pub fn cases() -> &'static [Case] {
    CASES
}

/// A case that failed, with its panic message.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CaseFailure {
    /// The case, as `group::name`.
    pub case: String,
    /// Why it failed.
    pub message: String,
}

/// What [`run_each`] found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    passed: Vec<String>,
    failures: Vec<CaseFailure>,
    elapsed: Duration,
}

impl Report {
    /// The cases that passed, as `group::name`.
    pub fn passed(&self) -> &[String] {
        &self.passed
    }

    /// The cases that failed.
    pub fn failures(&self) -> &[CaseFailure] {
        &self.failures
    }

    /// Whether every case passed.
    pub fn is_success(&self) -> bool {
        self.failures.is_empty()
    }

    /// Whether the case `group::name` (or just `name`) failed.
    pub fn failed(&self, case: &str) -> bool {
        self.failures
            .iter()
            .any(|f| f.case == case || f.case.rsplit("::").next() == Some(case))
    }

    /// How long the whole run took.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.passed.len() + self.failures.len();
        write!(
            f,
            "{} of {total} conformance cases failed in {:.1?}",
            self.failures.len(),
            self.elapsed
        )?;
        for failure in &self.failures {
            write!(f, "\n- {}: {}", failure.case, failure.message)?;
        }
        Ok(())
    }
}

/// Runs every case, each on a fresh fixture, several at once, and reports
/// which failed. A case fails by panicking or by running past its timeout
/// (two minutes, more for many schedules; see
/// [`Interleavings::case_timeout`]). The generated interleavings take their
/// settings from the environment ([`Interleavings::from_env`]).
///
/// Must be called within a tokio runtime; a multi-threaded one lets the
/// cases' racing callers truly run in parallel.
pub async fn run_each<F: Factory>(factory: F) -> Report {
    run_each_with(factory, &Interleavings::from_env()).await
}

/// Runs every case like [`run_each`], with the generated interleavings set
/// by `settings` (how many schedules, how many at once, on what lease).
pub async fn run_each_with<F: Factory>(factory: F, settings: &Interleavings) -> Report {
    let began = Instant::now();
    let factory: Arc<dyn Factory> = Arc::new(factory);
    let permits = Arc::new(Semaphore::new(PARALLEL));
    let mut tasks = JoinSet::new();
    for (index, case) in cases().iter().enumerate() {
        let (factory, permits) = (Arc::clone(&factory), Arc::clone(&permits));
        let settings = settings.clone();
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            (index, outcome(case, factory, settings).await)
        });
    }
    let mut outcomes = vec![None; cases().len()];
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((index, outcome)) => outcomes[index] = Some(outcome),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let mut report = Report::default();
    for (case, outcome) in cases().iter().zip(outcomes) {
        let name = format!("{}::{}", case.group, case.name);
        match outcome {
            Some(Ok(())) => report.passed.push(name),
            Some(Err(message)) => report.failures.push(CaseFailure {
                case: name,
                message,
            }),
            None => report.failures.push(CaseFailure {
                case: name,
                message: "did not run".to_owned(),
            }),
        }
    }
    report.elapsed = began.elapsed();
    report
}

/// Runs every case like [`run_each`] and panics with the list of failures
/// if any case failed.
pub async fn run_all<F: Factory>(factory: F) {
    run_all_with(factory, &Interleavings::from_env()).await;
}

/// Runs every case like [`run_each_with`] and panics with the list of
/// failures if any case failed.
pub async fn run_all_with<F: Factory>(factory: F, settings: &Interleavings) {
    let report = run_each_with(factory, settings).await;
    if !report.is_success() {
        panic!("{report}");
    }
}

/// Runs one case in its own task, so a panic is caught as its failure.
async fn outcome(
    case: &'static Case,
    factory: Arc<dyn Factory>,
    settings: Interleavings,
) -> Result<(), String> {
    let timeout = settings.case_timeout();
    let run = tokio::spawn(SETTINGS.scope(settings, async move { case.run(&*factory).await }));
    let abort = run.abort_handle();
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.is_panic() => Err(panic_message(e.into_panic())),
        Ok(Err(e)) => Err(format!("was cancelled: {e}")),
        Err(_) => {
            abort.abort();
            Err(format!("did not finish within {timeout:?}"))
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_owned(),
            Err(_) => "panicked".to_owned(),
        },
    }
}

/// Runs one case for [`store_tests!`](crate::store_tests), failing it if it
/// hangs.
pub async fn run_case<'a, Fut>(factory: &'a dyn Factory, case: impl FnOnce(&'a dyn Factory) -> Fut)
where
    Fut: Future<Output = ()> + Send + 'a,
{
    let timeout = settings::current().case_timeout();
    if tokio::time::timeout(timeout, case(factory)).await.is_err() {
        panic!("the case did not finish within {timeout:?}");
    }
}
