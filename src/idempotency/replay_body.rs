//! [`ReplayBody`], the response body of an [`IdempotencyService`](super::IdempotencyService):
//! the tower body adapter of the replay core's [`CapturingBody`].

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use tower_lock_core::CapturingBody;

use super::http_chunks::HttpChunks;

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
        // A replay (or a rejection): its body, then its trailers if it had some.
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Plain { #[pin] body: B },
        Capturing { capturing: CapturingBody<HttpChunks<B>> },
    }
}

impl<B> ReplayBody<B> {
    /// A replayed body, `data` then `trailers` (a stored gRPC response's status).
    pub(crate) fn replayed(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: ReplayKind::Full {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    pub(crate) fn plain(body: B) -> Self {
        Self {
            kind: ReplayKind::Plain { body },
        }
    }
}

impl<B> ReplayBody<B> {
    /// The body, captured for replay as it streams out (by the core's replay protocol).
    pub(crate) fn capturing(capturing: CapturingBody<HttpChunks<B>>) -> Self {
        Self {
            kind: ReplayKind::Capturing { capturing },
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
            ReplayKindProj::Full { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            ReplayKindProj::Plain { body } => body.poll_frame(cx),
            ReplayKindProj::Capturing { capturing } => capturing.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ReplayKind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            ReplayKind::Plain { body } => body.is_end_stream(),
            // Until the capture is finished, the server must poll once more.
            ReplayKind::Capturing { capturing } => capturing.source().is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ReplayKind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            ReplayKind::Plain { body } => body.size_hint(),
            ReplayKind::Capturing { capturing } => capturing
                .source()
                .map_or_else(|| SizeHint::with_exact(0), |b| b.get_ref().size_hint()),
        }
    }
}
