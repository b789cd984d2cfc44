//! [`LockedBody`], the response body of a [`LockService`](crate::LockService).

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use tower_lock_core::LockGuard;

pin_project! {
    /// The inner response body plus the request's lease, released when the body ends
    /// (its last frame is taken, it fails, or it is dropped); or a rejection body. The body
    /// of a response with no body to send holds no lease: it was released before the
    /// response was returned.
    pub struct LockedBody<B>
    where
        B: Body,
    {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B>
    where
        B: Body,
    {
        Inner {
            #[pin]
            body: B,
            held: Option<LockGuard>,
        },
        Rejection {
            body: Option<Bytes>,
        },
    }
}

impl<B: Body> LockedBody<B> {
    pub(crate) fn new(body: B, held: Option<LockGuard>) -> Self {
        Self {
            kind: Kind::Inner { body, held },
        }
    }

    pub(crate) fn rejection(body: Bytes) -> Self {
        Self {
            kind: Kind::Rejection {
                body: (!body.is_empty()).then_some(body),
            },
        }
    }
}

impl<B: Body> fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { held, .. } => {
                if held.is_some() {
                    "inner, holding lease"
                } else {
                    "inner"
                }
            }
            Kind::Rejection { .. } => "rejection",
        };
        f.debug_struct("LockedBody").field("kind", &kind).finish()
    }
}

impl<B> Body for LockedBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { mut body, held } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                let ended = match &frame {
                    None | Some(Err(_)) => true,
                    Some(Ok(_)) => body.is_end_stream(),
                };
                if ended && let Some(held) = held.take() {
                    // Released before the last frame is handed over, so a client that has
                    // the whole response finds the key free for its next request. The
                    // frame itself is never held back (a delayed last write would wait on
                    // Nagle's algorithm).
                    held.release_now();
                }
                Poll::Ready(frame)
            }
            KindProj::Rejection { body } => {
                Poll::Ready(body.take().map(|b| Ok(Frame::data(B::Data::from(b)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            // While the lease is held, the server must poll once more so that it is
            // released before the response completes.
            Kind::Inner { body, held } => held.is_none() && body.is_end_stream(),
            Kind::Rejection { body } => body.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Rejection { body } => {
                SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
