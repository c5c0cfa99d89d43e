//! The queue conformance kit: proves a [`Queue`] backend keeps the
//! contract, with fixed cases and generated interleavings of enqueuers and
//! workers that crash, stall past their lease and finish late.
//!
//! A backend's tests provide a [`QueueFactory`] — any `async fn() ->
//! QueueFixture` — that builds a fresh, isolated queue per case (a temp
//! file, a table of its own), and expand [`queue_tests!`](crate::queue_tests)
//! for one `#[tokio::test]` per case, or call [`run_all`].
//!
//! ```no_run
//! use idem_inbox::conformance::QueueFixture;
//! use idem_inbox::queue::SqliteQueue;
//!
//! async fn factory() -> QueueFixture {
//!     let dir = tempfile::tempdir().unwrap();
//!     let queue = SqliteQueue::open(dir.path().join("q.db")).await.unwrap();
//!     QueueFixture::new(queue, dir)
//! }
//!
//! idem_inbox::queue_tests!(factory);
//! # fn main() {}
//! ```

pub mod cases;
mod support;

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use crate::queue::Queue;

/// A fresh, isolated queue for one case, and what must live as long as it.
pub struct QueueFixture {
    queue: Arc<dyn Queue>,
    // After `queue`, so the queue is dropped before its file or table goes.
    _guard: Box<dyn Any + Send + Sync>,
}

impl QueueFixture {
    /// A fixture over `queue`, keeping `guard` (a temp dir, a table dropper)
    /// alive until the case ends. Pass `()` when there is nothing to clean.
    pub fn new<Q: Queue>(queue: Q, guard: impl Send + Sync + 'static) -> QueueFixture {
        QueueFixture {
            queue: Arc::new(queue),
            _guard: Box::new(guard),
        }
    }

    /// The queue under test.
    pub fn queue(&self) -> Arc<dyn Queue> {
        Arc::clone(&self.queue)
    }
}

impl fmt::Debug for QueueFixture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueFixture")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

/// Builds a fresh, isolated [`QueueFixture`] for each case.
#[async_trait]
pub trait QueueFactory: Send + Sync + 'static {
    /// A new fixture, isolated from every other one.
    async fn fixture(&self) -> QueueFixture;
}

#[async_trait]
impl<F, Fut> QueueFactory for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = QueueFixture> + Send,
{
    async fn fixture(&self) -> QueueFixture {
        self().await
    }
}

/// The one list of cases, grouped by concern; every entry point expands
/// from it.
#[doc(hidden)]
#[macro_export]
macro_rules! __queue_cases {
    ($callback:ident ! $args:tt) => {
        $crate::$callback! { $args
            enqueue {
                enqueued_job_is_claimed_with_its_fields,
                duplicate_event_is_reported_and_queued_once,
                same_event_id_from_another_source_is_another_job,
                dedupe_key_makes_another_event_id_a_duplicate,
                completed_event_is_still_a_duplicate,
                delayed_job_is_not_due_before_its_delay,
                concurrent_enqueues_queue_each_event_once,
            }
            claim {
                claim_returns_at_most_the_batch_and_each_job_once,
                concurrent_claims_never_share_a_job,
                every_claim_gets_a_new_token_and_attempt,
                zero_batch_claims_nothing,
            }
            settle {
                completed_job_is_never_claimed_again,
                retried_job_is_due_again_with_its_error,
                retry_delay_is_honoured,
                released_job_is_due_at_once_without_an_attempt,
                settling_an_unknown_job_is_lease_lost,
                group_completion_fences_each_job_by_its_token,
            }
            lease {
                lapsed_lease_makes_the_job_claimable_again,
                lapses_and_attempts_are_counted_apart,
                heartbeat_keeps_a_job_past_its_lease,
                late_worker_cannot_settle_a_job_another_now_holds,
                late_worker_settles_when_nobody_took_over,
            }
            dead {
                dead_letter_keeps_the_job_and_its_history,
                requeue_makes_a_dead_letter_due_again,
                requeue_touches_only_dead_letters,
            }
            interleaving {
                generated_schedules_lose_nothing_and_fence_every_late_worker,
            }
        }
    };
}

/// Emits one test per case; see [`queue_tests!`](crate::queue_tests).
#[doc(hidden)]
#[macro_export]
macro_rules! __queue_emit_tests {
    ({ $factory:path } $($group:ident { $($case:ident),* $(,)? })*) => {
        $(
            #[allow(unused_imports)]
            mod $group {
                use super::*;
                // The test attribute names its runtime `tokio`.
                use $crate::conformance::__private::tokio;

                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        $crate::conformance::cases::$group::$case(&$factory).await;
                    }
                )*
            }
        )*
    };
}

/// Emits one `#[tokio::test]` per queue conformance case, in one module per
/// group, for the factory at `$factory`.
#[macro_export]
macro_rules! queue_tests {
    ($factory:path) => {
        $crate::__queue_cases! { __queue_emit_tests! { $factory } }
    };
}

/// Builds the list behind [`run_all`].
#[doc(hidden)]
#[macro_export]
macro_rules! __queue_case_table {
    ({} $($group:ident { $($case:ident),* $(,)? })*) => {
        /// Every case as (group, name, runner).
        fn case_table() -> Vec<(&'static str, &'static str, CaseFn)> {
            vec![$($(
                (
                    stringify!($group),
                    stringify!($case),
                    |factory| ::std::boxed::Box::pin($crate::conformance::cases::$group::$case(factory)),
                ),
            )*)*]
        }
    };
}

type CaseFn =
    for<'a> fn(&'a dyn QueueFactory) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

crate::__queue_cases! { __queue_case_table! {} }

/// The names of every case, as `group::name`, in list order.
pub fn case_names() -> Vec<String> {
    case_table()
        .into_iter()
        .map(|(group, name, _)| format!("{group}::{name}"))
        .collect()
}

/// Runs every case in turn, each on a fresh fixture, and panics naming the
/// cases that failed.
pub async fn run_all<F: QueueFactory>(factory: F) {
    let factory: Arc<dyn QueueFactory> = Arc::new(factory);
    let mut failed = Vec::new();
    for (group, name, run) in case_table() {
        let factory = Arc::clone(&factory);
        let outcome = tokio::spawn(async move { run(&*factory).await }).await;
        if let Err(e) = outcome {
            failed.push(format!("{group}::{name}: {e}"));
        }
    }
    assert!(
        failed.is_empty(),
        "queue conformance cases failed:\n- {}",
        failed.join("\n- ")
    );
}

/// What [`queue_tests!`](crate::queue_tests) needs in the calling crate.
/// Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use tokio;
}
