//! [`CapturingBody`]: a response body on its way to the client, captured for replay as it
//! goes, and drained into the record if the client leaves before its end.

use std::{
    fmt,
    panic::{self, AssertUnwindSafe},
    pin::Pin,
    task::{Context, Poll, ready},
};

use super::{Capture, ChunkSource, Drain};

/// The body of a response that runs under its idempotency key: each item passes on to the
/// client and into the response's capture; at the end of the body the response is stored and the
/// key released. A framework's response body wraps it (its body adapter) and forwards its
/// items.
///
/// Dropped before its end (the client went away, or the caller only looked at the head),
/// it reads what the body already has on the spot, so a whole body is stored before the
/// drop returns, and hands the rest to the framework's spawner ([`Leftover`](super::Leftover)). A body that fails
/// mid-stream completed a request whose response cannot be kept: under a status that is
/// stored, a retry is answered `409` `response-not-stored`; under another, or with no
/// status yet (a gRPC response before its trailers), the key is released with nothing
/// recorded and a retry runs. A body that panics stores nothing: the
/// key is released and a retry runs again.
pub struct CapturingBody<S> {
    /// `None` once the body ended (or panicked).
    source: Option<Pin<Box<S>>>,
    capture: Option<Capture>,
    spawn: fn(Drain<S>),
    /// How a drop reads what an unfinished body has ready ([`Drain::read_ready`]): set
    /// where `S: ChunkSource` is known, so that the type (and the framework body around
    /// it) needs no bound.
    read_ready: fn(&mut Drain<S>) -> Poll<()>,
}

impl<S> fmt::Debug for CapturingBody<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CapturingBody")
            .field("ended", &self.source.is_none())
            .field("capture", &self.capture)
            .finish_non_exhaustive()
    }
}

impl<S: ChunkSource> CapturingBody<S> {
    /// `source`, captured into `capture`; `spawn` runs the drain of a body dropped before
    /// its end (on the framework's runtime: the handler's work belongs there).
    pub(super) fn new(source: S, capture: Capture, spawn: fn(Drain<S>)) -> Self {
        Self {
            source: Some(Box::pin(source)),
            capture: Some(capture),
            spawn,
            read_ready: Drain::<S>::read_ready,
        }
    }

    /// The next item of the body, captured on its way.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<S::Item, S::Error>>> {
        let Some(source) = self.source.as_mut() else {
            return Poll::Ready(None);
        };
        let item = match panic::catch_unwind(AssertUnwindSafe(|| source.as_mut().poll_next(cx))) {
            Ok(poll) => ready!(poll),
            Err(panic) => {
                // The body panicked: it must not be polled again, not even by the drain
                // that a drop would start (a panic inside the unwinding would abort the
                // process). Release the key, store nothing, and let the panic cost this
                // response alone.
                self.source = None;
                self.capture = None;
                panic::resume_unwind(panic)
            }
        };
        let ended = match &item {
            Some(Ok(item)) => {
                if let Some(capture) = &mut self.capture {
                    capture.feed(S::chunk(item));
                }
                source.is_end()
            }
            None => true,
            Some(Err(_)) => {
                // The request completed (its handler ran) and its response cannot be kept:
                // recorded as not stored if its status is one that is stored, so a retry
                // is answered `409` rather than run a second time; else (or with no status
                // yet: a gRPC response before its trailers) released.
                if let Some(capture) = &mut self.capture {
                    capture.cut_off();
                }
                true
            }
        };
        if ended {
            self.source = None;
            if let Some(capture) = self.capture.take() {
                // Begun before the last item is handed over, so that a client that has the
                // whole response finds the record when it retries (an in-process store
                // writes it on the spot); finished on the engine's own runtime.
                drop(capture.finish());
            }
        }
        Poll::Ready(item)
    }
}

impl<S> CapturingBody<S> {
    /// The body, until it ends.
    pub fn source(&self) -> Option<&S> {
        self.source.as_deref()
    }
}

impl<S> Drop for CapturingBody<S> {
    fn drop(&mut self) {
        // The response was dropped before its body ended: finish reading it, store it,
        // release.
        if let (Some(source), Some(capture)) = (self.source.take(), self.capture.take()) {
            if std::thread::panicking() {
                // Dropped while something unwinds: polling user code now could panic
                // inside the panic (an abort). Release, store nothing.
                return;
            }
            // What is there already is read on the spot; only a body still being produced
            // goes to a task.
            let mut drain = Drain::new(source, capture);
            if (self.read_ready)(&mut drain).is_pending() {
                (self.spawn)(drain);
            }
        }
    }
}
