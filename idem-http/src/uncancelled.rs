//! A future that cannot be cancelled by dropping it: what is left of it
//! goes on in a task the adapter spawns.

use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Runs `F` in the future that awaits it, with no task of its own, and
/// hands whatever is left of `F` to `spawn` if that future is dropped
/// first (the client hung up), so that a hang-up cancels neither the claim,
/// nor the handler, nor its recording.
///
/// Spawning every exchange would give the same guarantee, at the price of
/// a task per request (and on a multi-threaded runtime a hop between
/// threads for every replay); this spawns only for the few requests whose
/// client goes away mid-exchange. A panic in `F` is caught and reported as
/// [`Panicked`], as a task's join would.
///
/// Where the rest runs is the adapter's to decide, so the spawn is a
/// closure rather than a runtime: `idem-tower` spawns on the tokio runtime
/// the request came in on (its futures are `Send`, and a tokio `Handle`
/// takes a task from any thread), while `idem-actix` spawns a local task on
/// the worker that ran the request (its futures are not `Send`), and its
/// closure guards that spawn, which panics outside the actix runtime.
/// `spawn` is called at most once, from `Drop`, and must not panic: a
/// destructor that panics while its thread unwinds aborts the process.
///
/// ```
/// use idem_http::Uncancelled;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let runtime = tokio::runtime::Handle::current();
/// let exchange = Uncancelled::new(async { 7 }, move |rest| drop(runtime.spawn(rest)));
/// assert_eq!(exchange.await.ok(), Some(7));
/// # }
/// ```
pub struct Uncancelled<F, S>
where
    F: Future,
    S: FnOnce(Pin<Box<F>>),
{
    future: Option<Pin<Box<F>>>,
    spawn: Option<S>,
}

// `F` is boxed and `S` is never pinned, so moving an `Uncancelled` moves
// nothing that is pinned.
impl<F: Future, S: FnOnce(Pin<Box<F>>)> Unpin for Uncancelled<F, S> {}

/// `F` panicked while it was polled, or its [`Uncancelled`] was polled
/// again after it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panicked;

impl<F: Future, S: FnOnce(Pin<Box<F>>)> Uncancelled<F, S> {
    /// `future`, handed to `spawn` if it is dropped before it is done.
    pub fn new(future: F, spawn: S) -> Uncancelled<F, S> {
        Uncancelled {
            future: Some(Box::pin(future)),
            spawn: Some(spawn),
        }
    }
}

impl<F: Future, S: FnOnce(Pin<Box<F>>)> fmt::Debug for Uncancelled<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Uncancelled")
            .field("done", &self.future.is_none())
            .finish_non_exhaustive()
    }
}

impl<F: Future, S: FnOnce(Pin<Box<F>>)> Future for Uncancelled<F, S> {
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(future) = self.future.as_mut() else {
            // Polled again after it finished: nothing left to run.
            return Poll::Ready(Err(Panicked));
        };
        let polled = panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.future = None;
                Poll::Ready(Ok(output))
            }
            Err(_) => {
                // A future that panicked must not be polled again, nor
                // handed to a task.
                self.future = None;
                Poll::Ready(Err(Panicked))
            }
        }
    }
}

impl<F: Future, S: FnOnce(Pin<Box<F>>)> Drop for Uncancelled<F, S> {
    fn drop(&mut self) {
        if let (Some(future), Some(spawn)) = (self.future.take(), self.spawn.take()) {
            // The task polls it at once, so it wakes on its own wakers from
            // then on; the waker it held belongs to the dropped future.
            spawn(future);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::runtime::Handle;

    use super::*;

    /// Spawns the rest on the current tokio runtime.
    fn on_tokio<F: Future + Send + 'static>(rest: Pin<Box<F>>)
    where
        F::Output: Send,
    {
        drop(Handle::current().spawn(rest));
    }

    #[tokio::test]
    async fn a_dropped_future_still_runs_to_the_end_once() {
        let (started, finished) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (gate, wait) = tokio::sync::oneshot::channel::<()>();
        let (done, ended) = tokio::sync::oneshot::channel::<()>();
        let work = {
            let (started, finished) = (Arc::clone(&started), Arc::clone(&finished));
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = wait.await;
                finished.fetch_add(1, Ordering::SeqCst);
                let _ = done.send(());
            }
        };
        let mut uncancelled = Uncancelled::new(work, on_tokio);
        let mut context = Context::from_waker(std::task::Waker::noop());
        assert!(
            Pin::new(&mut uncancelled).poll(&mut context).is_pending(),
            "the work waits for the gate"
        );
        drop(uncancelled);
        assert_eq!(finished.load(Ordering::SeqCst), 0);
        gate.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .expect("the dropped work finished in its own task")
            .unwrap();
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(finished.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_finished_future_is_not_spawned_and_a_panic_is_reported() {
        let (runs, spawns) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (counted, spawned) = (Arc::clone(&runs), Arc::clone(&spawns));
        let done = Uncancelled::new(
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                7
            },
            move |rest| {
                spawned.fetch_add(1, Ordering::SeqCst);
                on_tokio(rest);
            },
        );
        assert_eq!(done.await, Ok(7));
        tokio::task::yield_now().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(spawns.load(Ordering::SeqCst), 0);

        let boom = runs.load(Ordering::SeqCst) == 1;
        let panicking = Uncancelled::new(
            async move {
                if boom {
                    panic!("the handler panicked");
                }
            },
            |_| unreachable!("a future that panicked is not handed on"),
        );
        assert_eq!(panicking.await, Err(Panicked));
    }
}
