//! The bodies of an [`IdempotencyService`](super::IdempotencyService): [`RequestBody`] for
//! the inner service's requests, [`ReplayBody`] for its responses.

use std::{
    fmt,
    panic::{self, AssertUnwindSafe},
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::replay_locker::Capture;
use crate::engine::runtime;

pin_project! {
    /// The request body the inner service of an
    /// [`IdempotencyService`](super::IdempotencyService) receives: the bytes the layer read
    /// to fingerprint the request, or, for a request the layer does not cover, the
    /// original body untouched.
    pub struct RequestBody<B> {
        #[pin]
        kind: RequestKind<B>,
    }
}

pin_project! {
    #[project = RequestKindProj]
    enum RequestKind<B> {
        Buffered { data: Option<Bytes> },
        Streaming { #[pin] body: B },
    }
}

impl<B> RequestBody<B> {
    pub(crate) fn buffered(data: Bytes) -> Self {
        RequestBody {
            kind: RequestKind::Buffered {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn streaming(body: B) -> Self {
        RequestBody {
            kind: RequestKind::Streaming { body },
        }
    }
}

impl<B> fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            RequestKind::Buffered { .. } => "buffered",
            RequestKind::Streaming { .. } => "streaming",
        };
        f.debug_struct("RequestBody").field("kind", &kind).finish()
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            RequestKindProj::Buffered { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d))))
            }
            RequestKindProj::Streaming { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Buffered { data } => data.is_none(),
            RequestKind::Streaming { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Buffered { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            RequestKind::Streaming { body } => body.size_hint(),
        }
    }
}

/// Where a response body no client reads any more is finished: drained into its capture
/// on a task, so that the response is stored and the key released. A plain function
/// pointer, made where the body type is known to be `Send + 'static`.
pub(crate) type Drain<B> = fn(Pin<Box<B>>, Capture);

pin_project! {
    /// The response body of an [`IdempotencyService`](super::IdempotencyService): the inner
    /// body (captured for replay while it streams to the client), a replayed body, or a
    /// rejection.
    pub struct ReplayBody<B> {
        #[pin]
        kind: ReplayKind<B>,
    }
}

pin_project! {
    #[project = ReplayKindProj]
    enum ReplayKind<B> {
        Full { data: Option<Bytes> },
        Plain { #[pin] body: B },
        Capturing { capturing: Capturing<B> },
    }
}

/// The inner body of a request that runs under its key, and its capture.
pub(crate) struct Capturing<B> {
    body: Option<Pin<Box<B>>>,
    capture: Option<Capture>,
    drain: Drain<B>,
}

impl<B> ReplayBody<B> {
    pub(crate) fn full(data: Bytes) -> Self {
        ReplayBody {
            kind: ReplayKind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn plain(body: B) -> Self {
        ReplayBody {
            kind: ReplayKind::Plain { body },
        }
    }

    pub(crate) fn capturing(body: Pin<Box<B>>, capture: Capture, drain: Drain<B>) -> Self {
        ReplayBody {
            kind: ReplayKind::Capturing {
                capturing: Capturing {
                    body: Some(body),
                    capture: Some(capture),
                    drain,
                },
            },
        }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            ReplayKind::Full { .. } => "full",
            ReplayKind::Plain { .. } => "plain",
            ReplayKind::Capturing { .. } => "capturing",
        };
        f.debug_struct("ReplayBody").field("kind", &kind).finish()
    }
}

impl<B> Capturing<B>
where
    B: Body<Data = Bytes>,
{
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match panic::catch_unwind(AssertUnwindSafe(|| body.as_mut().poll_frame(cx))) {
            Ok(poll) => ready!(poll),
            Err(panic) => {
                // The body panicked: it must not be polled again, not even by the drain
                // that a drop would start (a panic inside the unwinding would abort the
                // process). Release the key, store nothing, and let the panic cost this
                // response alone.
                self.body = None;
                self.capture = None;
                panic::resume_unwind(panic)
            }
        };
        let ended = match &frame {
            Some(Ok(frame)) => {
                if let Some(capture) = &mut self.capture {
                    if let Some(data) = frame.data_ref() {
                        capture.data(data);
                    } else if frame.is_trailers() {
                        capture.trailers();
                    }
                }
                body.is_end_stream()
            }
            None => true,
            Some(Err(_)) => {
                // A body that fails mid-stream stores nothing: the retry runs again.
                drop(self.capture.take());
                true
            }
        };
        if ended {
            self.body = None;
            if let Some(capture) = self.capture.take() {
                // Started before the last frame is handed over, so that a client that
                // has the whole response finds the record when it retries (on an
                // in-process store it is written on the spot).
                runtime::detach(capture.finish());
            }
        }
        Poll::Ready(frame)
    }
}

impl<B> Drop for Capturing<B> {
    fn drop(&mut self) {
        // The response was dropped before its body ended (the client went away, or the
        // caller only looked at the head): finish reading it, store it, release. What is
        // already there (a full body, say) is read here, so the record is in place
        // before the drop returns; only a body still being produced goes to a task.
        if let (Some(body), Some(capture)) = (self.body.take(), self.capture.take()) {
            if std::thread::panicking() {
                // Dropped while something unwinds: polling user code now could panic
                // inside the panic (an abort). Release, store nothing.
                return;
            }
            (self.drain)(body, capture);
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            ReplayKindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            ReplayKindProj::Plain { body } => body.poll_frame(cx),
            ReplayKindProj::Capturing { capturing } => capturing.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ReplayKind::Full { data } => data.is_none(),
            ReplayKind::Plain { body } => body.is_end_stream(),
            // Until the capture is finished, the server must poll once more.
            ReplayKind::Capturing { capturing } => capturing.body.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ReplayKind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            ReplayKind::Plain { body } => body.size_hint(),
            ReplayKind::Capturing { capturing } => capturing
                .body
                .as_ref()
                .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint()),
        }
    }
}
