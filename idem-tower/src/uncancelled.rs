//! A future that cannot be cancelled by dropping it: what is left of it
//! goes on in a task of its own.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;

/// Runs `F` in the future that awaits it, with no task of its own, and
/// hands whatever is left of `F` to a new task on the runtime if that
/// future is dropped first (the client hung up).
///
/// Spawning every exchange would give the same guarantee, at the price of
/// a task per request and a hop between threads for every replay; this
/// spawns only for the few requests whose client goes away mid-exchange.
/// A panic in `F` is caught and reported, as a task's join would.
pub(crate) struct Uncancelled<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    future: Option<Pin<Box<F>>>,
    runtime: Handle,
}

/// `F` panicked while it was polled.
#[derive(Debug)]
pub(crate) struct Panicked;

impl<F: Future + Send + 'static> Uncancelled<F>
where
    F::Output: Send + 'static,
{
    /// `future`, finished on `runtime` if it is dropped before it is done.
    pub(crate) fn new(future: F, runtime: Handle) -> Uncancelled<F> {
        Uncancelled {
            future: Some(Box::pin(future)),
            runtime,
        }
    }
}

impl<F: Future + Send + 'static> Future for Uncancelled<F>
where
    F::Output: Send + 'static,
{
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

impl<F: Future + Send + 'static> Drop for Uncancelled<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(future) = self.future.take() {
            // The task polls it at once, so it wakes on its own wakers from
            // then on; the waker it held belongs to the dropped future.
            drop(self.runtime.spawn(future));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

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
        let mut uncancelled = Uncancelled::new(work, Handle::current());
        assert!(
            futures_poll_once(&mut uncancelled).is_pending(),
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
    async fn a_finished_future_is_not_run_again_and_a_panic_is_reported() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&runs);
        let done = Uncancelled::new(
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                7
            },
            Handle::current(),
        );
        assert_eq!(done.await.unwrap(), 7);
        tokio::task::yield_now().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let boom = runs.load(Ordering::SeqCst) == 1;
        let panicking = Uncancelled::new(
            async move {
                if boom {
                    panic!("the handler panicked");
                }
            },
            Handle::current(),
        );
        assert!(panicking.await.is_err());
    }

    fn futures_poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        let waker = std::task::Waker::noop();
        Pin::new(future).poll(&mut Context::from_waker(waker))
    }
}
