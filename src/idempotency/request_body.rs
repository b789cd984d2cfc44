//! [`RequestBody`], the request body the inner service of an
//! [`IdempotencyService`](super::IdempotencyService) receives.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

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
        Self {
            kind: RequestKind::Buffered {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn streaming(body: B) -> Self {
        Self {
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
