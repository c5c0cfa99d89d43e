//! A future that cannot be cancelled by dropping it: what is left of it
//! goes on in a local task of the worker it was running on.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Runs `F` in the future that awaits it, with no task of its own, and
/// hands whatever is left of `F` to a new local task (`actix_web::rt::spawn`)
/// if that future is dropped first (the client hung up).
///
/// Spawning every exchange would give the same guarantee at the price of a
/// task per request; this spawns only for the few requests whose client
/// goes away mid-exchange. The task runs on the same worker thread, as the
/// request did, so `F` need not be `Send`. A panic in `F` is caught and
/// reported, as a task's join would.
pub(crate) struct Uncancelled<F: Future + 'static> {
    future: Option<Pin<Box<F>>>,
}

/// `F` panicked while it was polled.
#[derive(Debug)]
pub(crate) struct Panicked;

impl<F: Future + 'static> Uncancelled<F> {
    /// `future`, finished in a local task if it is dropped before it is
    /// done.
    pub(crate) fn new(future: F) -> Uncancelled<F> {
        Uncancelled {
            future: Some(Box::pin(future)),
        }
    }
}

impl<F: Future + 'static> Future for Uncancelled<F> {
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

impl<F: Future + 'static> Drop for Uncancelled<F> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        if std::thread::panicking() {
            // Spawning could panic again, which aborts; the key stays
            // claimed until its lease lapses.
            tracing::error!("an exchange was dropped while its thread unwinds; its key stays claimed until its lease lapses");
            return;
        }
        // actix-web drops a request's future on the worker that ran it,
        // inside its local task set; a runtime shutting down may not be
        // able to take a task any more, and that must not become a panic
        // in a destructor.
        let spawned = panic::catch_unwind(AssertUnwindSafe(|| {
            // The task polls it at once, so it wakes on its own wakers from
            // then on; the waker it held belongs to the dropped future.
            drop(actix_web::rt::spawn(future));
        }));
        if spawned.is_err() {
            tracing::error!("an exchange was dropped outside the actix runtime; its key stays claimed until its lease lapses");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;

    #[actix_web::test]
    async fn a_dropped_future_still_runs_to_the_end_once() {
        let (started, finished) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
        let (gate, wait) = tokio::sync::oneshot::channel::<()>();
        let (done, ended) = tokio::sync::oneshot::channel::<()>();
        let work = {
            let (started, finished) = (Rc::clone(&started), Rc::clone(&finished));
            async move {
                started.set(started.get() + 1);
                let _ = wait.await;
                finished.set(finished.get() + 1);
                let _ = done.send(());
            }
        };
        let mut uncancelled = Uncancelled::new(work);
        assert!(
            poll_once(&mut uncancelled).is_pending(),
            "the work waits for the gate"
        );
        drop(uncancelled);
        assert_eq!(finished.get(), 0);
        gate.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .expect("the dropped work finished in its own task")
            .unwrap();
        assert_eq!((started.get(), finished.get()), (1, 1));
    }

    #[actix_web::test]
    async fn a_finished_future_is_not_run_again_and_a_panic_is_reported() {
        let runs = Rc::new(Cell::new(0));
        let counted = Rc::clone(&runs);
        let done = Uncancelled::new(async move {
            counted.set(counted.get() + 1);
            7
        });
        assert_eq!(done.await.unwrap(), 7);
        tokio::task::yield_now().await;
        assert_eq!(runs.get(), 1);

        let boom = runs.get() == 1;
        let panicking = Uncancelled::new(async move {
            if boom {
                panic!("the handler panicked");
            }
        });
        assert!(panicking.await.is_err());
    }

    #[test]
    fn a_future_dropped_outside_the_runtime_is_not_a_panic() {
        let mut uncancelled = Uncancelled::new(std::future::pending::<()>());
        assert!(poll_once(&mut uncancelled).is_pending());
        drop(uncancelled);
    }

    fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        Pin::new(future).poll(&mut Context::from_waker(std::task::Waker::noop()))
    }
}
