//! [`KeepRunning`]: a handler that runs on after its client left, so that its response is
//! still stored ([`Abandoned`]) and the client's retry gets the replay.

use std::{
    fmt,
    future::Future,
    panic::{self, AssertUnwindSafe},
    pin::Pin,
    task::{Context, Poll, ready},
};

use super::{Completion, Drain, ReplayResponse};

/// The handler's future and the request's [`Completion`]. If dropped before the response
/// is there (the client went away and the server gave up on the request), the handler is
/// not cancelled: it goes to `spawn` as an [`Abandoned`] request, which runs it to
/// completion, stores its response and only then releases the key.
///
/// A handler that fails drops the completion: the key is released, nothing is stored,
/// and a retry runs again. One that panics is never polled again: released, nothing
/// stored, and the panic goes on to cost this request alone.
pub struct KeepRunning<F, S> {
    future: Option<Pin<Box<F>>>,
    completion: Option<Completion>,
    spawn: fn(Abandoned<F, S>),
}

impl<F, S> fmt::Debug for KeepRunning<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepRunning")
            .field("completion", &self.completion)
            .finish_non_exhaustive()
    }
}

impl<F, S> KeepRunning<F, S> {
    /// The handler's `future`, running under `completion`; `spawn` runs it on (on the
    /// framework's runtime: the handler's work belongs there) if this is dropped first.
    pub fn new(future: F, completion: Completion, spawn: fn(Abandoned<F, S>)) -> Self {
        Self {
            future: Some(Box::pin(future)),
            completion: Some(completion),
            spawn,
        }
    }
}

impl<F, S, R, E> Future for KeepRunning<F, S>
where
    F: Future<Output = Result<R, E>>,
    R: ReplayResponse<Chunks = S>,
{
    /// The response and its completion, to be captured; or the handler's error.
    type Output = Result<(R, Completion), E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self.future.as_mut().expect("polled after completion");
        let out = match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(poll) => ready!(poll),
            Err(panic) => {
                // The handler panicked: it cannot be kept running (a panicked future must
                // not be polled again). Release the key, store nothing, and let the panic
                // go on to cost this request alone.
                self.future = None;
                self.completion = None;
                panic::resume_unwind(panic)
            }
        };
        self.future = None;
        let completion = self.completion.take().expect("polled after completion");
        // An error of the handler drops the completion: released, nothing stored.
        Poll::Ready(out.map(|res| (res, completion)))
    }
}

impl<F, S> Drop for KeepRunning<F, S> {
    fn drop(&mut self) {
        if let (Some(future), Some(completion)) = (self.future.take(), self.completion.take()) {
            (self.spawn)(Abandoned {
                running: Some((future, completion)),
                drain: None,
            });
        }
    }
}

/// A request whose client left while its handler ran: the handler runs to completion, its
/// response is captured and its body [drained](Drain) into the record, then the key is
/// released. Made by [`KeepRunning`] when it is dropped, for the framework's spawner.
pub struct Abandoned<F, S> {
    running: Option<(Pin<Box<F>>, Completion)>,
    drain: Option<Drain<S>>,
}

impl<F, S> fmt::Debug for Abandoned<F, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Abandoned")
            .field("running", &self.running.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, S, R, E> Future for Abandoned<F, S>
where
    F: Future<Output = Result<R, E>>,
    R: ReplayResponse<Chunks = S>,
    S: super::ChunkSource,
{
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some((future, _)) = self.running.as_mut() {
            let out = ready!(future.as_mut().poll(cx));
            let (_, completion) = self.running.take().expect("the handler was running");
            // A handler error: nothing to store; the completion's drop releases the key.
            let Ok(response) = out else {
                return Poll::Ready(());
            };
            let capture = completion.capture_response(&response);
            self.drain = Some(Drain::new(Box::pin(response.into_chunks()), capture));
        }
        match self.drain.as_mut() {
            Some(drain) => Pin::new(drain).poll(cx),
            None => Poll::Ready(()),
        }
    }
}
