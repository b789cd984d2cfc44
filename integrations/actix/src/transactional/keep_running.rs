//! [`KeepRunning`]: the transactional middleware's future, which a client that leaves does
//! not cancel once the handler began: the rest runs on a task of the worker's own, to its
//! commit or rollback, as the replay middleware's handlers do.

use std::{
    future::Future,
    panic::{self, AssertUnwindSafe},
    pin::Pin,
    task::{Context, Poll},
};

use tower_lock::idempotency::transactional::RunsOn;

/// `future` (the middleware's whole request) under `runs_on`: dropped after
/// [`RunsOn::begin`], it is spawned with `actix_web::rt::spawn` and runs to its end. A
/// future that panicked is never polled again: its transaction is dropped, rolled back.
pub(super) struct KeepRunning<F: Future + 'static> {
    future: Option<Pin<Box<F>>>,
    runs_on: RunsOn,
}

impl<F: Future + 'static> KeepRunning<F> {
    pub(super) fn new(future: F, runs_on: RunsOn) -> Self {
        Self {
            future: Some(Box::pin(future)),
            runs_on,
        }
    }
}

impl<F: Future + 'static> Future for KeepRunning<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let future = self.future.as_mut().expect("polled after completion");
        match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => {
                self.future = None;
                Poll::Ready(out)
            }
            Err(panic) => {
                self.future = None;
                panic::resume_unwind(panic)
            }
        }
    }
}

impl<F: Future + 'static> Drop for KeepRunning<F> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        if !self.runs_on.client_left() {
            // Before the handler: nothing happened yet, and nothing runs on.
            return;
        }
        // actix drops a request's future on its worker, inside the worker's local task
        // set; outside one (a future polled by hand) the spawn panics, and the future is
        // dropped instead: its transaction rolls back.
        let _ = panic::catch_unwind(AssertUnwindSafe(move || {
            drop(actix_web::rt::spawn(async move {
                let _ = future.await;
            }));
        }));
    }
}
