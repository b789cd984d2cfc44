//! [`LockedBody`]: the response body that holds the request's lease until it ends.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project_lite::pin_project;
use tower_lock_core::LockGuard;

pin_project! {
    /// A response body that owns the request's lease and releases it when the body ends:
    /// its last chunk has been taken, it failed, or it was dropped (the client went away).
    pub struct LockedBody<B> {
        #[pin]
        body: B,
        held: Option<LockGuard>,
    }
}

impl<B> LockedBody<B> {
    /// `body`, holding `held` (if any) until it ends.
    pub fn new(body: B, held: Option<LockGuard>) -> Self {
        Self { body, held }
    }

    /// `true` while the body still holds its lease.
    pub fn is_holding(&self) -> bool {
        self.held.is_some()
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.body
    }
}

impl<B> fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockedBody")
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl<B: MessageBody> MessageBody for LockedBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        let chunk = std::task::ready!(this.body.poll_next(cx));
        if !matches!(chunk, Some(Ok(_)))
            && let Some(held) = this.held.take()
        {
            // The body is done (or broken): release before the response completes, so a
            // client that has the whole response finds the key free for its next request.
            held.release_now();
        }
        Poll::Ready(chunk)
    }

    // `try_into_bytes` keeps its default (refuse): taking the bytes out would drop the
    // lease before the response is written.
}
