//! [`Drain`]: the rest of a response body that no client reads any more, read into its
//! capture so that the response is stored and the key released.

use std::{
    fmt,
    future::Future,
    panic::{self, AssertUnwindSafe},
    pin::Pin,
    task::{Context, Poll, Waker},
};

use tokio::time::{Instant, Sleep};

use super::{Capture, ChunkSource};

/// Reads the rest of a response body whose client left into its [`Capture`] (for at most
/// the layer's [drain time](super::ReplayLocker::max_drain_time)), then stores the response
/// and releases the key. A framework runs it on its spawner, as [`KeepRunning`] and
/// [`CapturingBody`] hand it over.
///
/// [`KeepRunning`]: super::KeepRunning
/// [`CapturingBody`]: super::CapturingBody
pub(crate) struct Drain<S> {
    source: Pin<Box<S>>,
    /// `None` once the capture is finished or given up (the body failed).
    capture: Option<Capture>,
    /// Set at the first poll on a task: a timer needs the runtime it is polled on.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The store-and-release under way, once the body is read.
    finishing: Option<Pin<Box<dyn Future<Output = ()> + Send + 'static>>>,
}

impl<S> fmt::Debug for Drain<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("capture", &self.capture)
            .finish_non_exhaustive()
    }
}

impl<S> Drain<S> {
    pub(super) fn new(source: Pin<Box<S>>, capture: Capture) -> Self {
        Self {
            source,
            capture: Some(capture),
            deadline: None,
            finishing: None,
        }
    }
}

impl<S: ChunkSource> Drain<S> {
    /// Read what the body has ready now, without waiting and without a timer (this runs in
    /// a `Drop`, maybe outside any runtime): `Ready` when the drain is over (the response
    /// stored or given up, the key's release begun), `Pending` when the rest is still being
    /// produced and must be read on a task.
    pub(super) fn read_ready(&mut self) -> Poll<()> {
        let Some(capture) = self.capture.as_mut() else {
            return Poll::Ready(());
        };
        let mut cx = Context::from_waker(Waker::noop());
        while capture.wants_data() {
            // User code, polled from a `Drop`: a panic here must not leave the drop (the
            // panic message is out; the capture is dropped, which releases the key).
            let Ok(poll) =
                panic::catch_unwind(AssertUnwindSafe(|| self.source.as_mut().poll_next(&mut cx)))
            else {
                self.capture = None;
                return Poll::Ready(());
            };
            match poll {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => break,
                Poll::Ready(Some(Ok(item))) => capture.feed(S::chunk(&item)),
                // Failed mid-stream: completed, not kept (see `CapturingBody`).
                Poll::Ready(Some(Err(_))) => {
                    capture.cut_off();
                    break;
                }
            }
        }
        // Begun here (an in-process store writes on the spot), finished on the engine's
        // own runtime.
        if let Some(capture) = self.capture.take() {
            drop(capture.finish());
        }
        Poll::Ready(())
    }
}

impl<S: ChunkSource> Future for Drain<S> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if let Some(capture) = this.capture.as_mut() {
            let deadline = this.deadline.get_or_insert_with(|| {
                Box::pin(tokio::time::sleep_until(
                    Instant::now() + capture.max_drain_time(),
                ))
            });
            // Read up to the limit: past it the response is known not to be kept (a gRPC
            // response's, up to its trailers: its status decides whether it is recorded).
            while capture.wants_data() {
                match this.source.as_mut().poll_next(cx) {
                    Poll::Ready(None) => break,
                    Poll::Ready(Some(Ok(item))) => capture.feed(S::chunk(&item)),
                    // Failed mid-stream: completed, not kept (see `CapturingBody`).
                    Poll::Ready(Some(Err(_))) => {
                        capture.cut_off();
                        break;
                    }
                    Poll::Pending => {
                        if deadline.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        // A body that does not end (a stream nobody reads any more) is cut
                        // off: the request completed, its response is not stored, the key
                        // is released.
                        capture.cut_off();
                        break;
                    }
                }
            }
            if let Some(capture) = this.capture.take() {
                this.finishing = Some(Box::pin(capture.finish()));
            }
        }
        match this.finishing.as_mut() {
            Some(finishing) => finishing.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}
