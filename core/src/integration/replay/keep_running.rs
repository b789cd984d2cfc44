//! [`KeepRunning`]: a handler that runs on after its client left, so that its response is
//! still stored ([`Abandoned`]) and the client's retry gets the replay.

use std::{
    fmt,
    future::Future,
    panic::{self, AssertUnwindSafe},
    pin::Pin,
    task::{Context, Poll, ready},
};

use super::{Completion, Drain, Leftover, ReplayAdapter};

/// The handler's call and the request's [`Completion`]. If dropped before the response is
/// there (the client went away and the server gave up on the request), the handler is not
/// cancelled: it goes to the framework's spawner as an [`Abandoned`] request, which runs it
/// to completion, stores its response and only then releases the key.
///
/// A handler that fails drops the completion: the key is released, nothing is stored,
/// and a retry runs again. One that panics is never polled again: released, nothing
/// stored, and the panic goes on to cost this request alone.
pub(super) struct KeepRunning<A: ReplayAdapter> {
    future: Option<Pin<Box<A::Call>>>,
    completion: Option<Completion>,
}

impl<A: ReplayAdapter> fmt::Debug for KeepRunning<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepRunning")
            .field("completion", &self.completion)
            .finish_non_exhaustive()
    }
}

impl<A: ReplayAdapter> KeepRunning<A> {
    /// The handler's `call`, running under `completion`.
    pub(super) fn new(call: A::Call, completion: Completion) -> Self {
        Self {
            future: Some(Box::pin(call)),
            completion: Some(completion),
        }
    }
}

impl<A: ReplayAdapter> Future for KeepRunning<A> {
    /// The response and its completion, to be captured; or the handler's error.
    type Output = Result<(A::Response, Completion), A::Error>;

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

impl<A: ReplayAdapter> Drop for KeepRunning<A> {
    fn drop(&mut self) {
        if let (Some(future), Some(completion)) = (self.future.take(), self.completion.take()) {
            A::spawn(Leftover::abandoned(Abandoned {
                running: Some((future, completion)),
                drain: None,
            }));
        }
    }
}

/// A request whose client left while its handler ran: the handler runs to completion, its
/// response is captured and its body [drained](Drain) into the record, then the key is
/// released. Made by [`KeepRunning`] when it is dropped, for the framework's spawner.
pub(super) struct Abandoned<A: ReplayAdapter> {
    running: Option<(Pin<Box<A::Call>>, Completion)>,
    drain: Option<Drain<A::Chunks>>,
}

impl<A: ReplayAdapter> fmt::Debug for Abandoned<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Abandoned")
            .field("running", &self.running.is_some())
            .finish_non_exhaustive()
    }
}

impl<A: ReplayAdapter> Future for Abandoned<A> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some((future, _)) = self.running.as_mut() {
            let out = ready!(future.as_mut().poll(cx));
            let (_, completion) = self.running.take().expect("the handler was running");
            // A handler error: nothing to store; the completion's drop releases the key.
            let Ok(response) = out else {
                return Poll::Ready(());
            };
            let capture = completion.capture_response::<A>(&response);
            self.drain = Some(Drain::new(Box::pin(A::into_chunks(response)), capture));
        }
        match self.drain.as_mut() {
            Some(drain) => Pin::new(drain).poll(cx),
            None => Poll::Ready(()),
        }
    }
}
