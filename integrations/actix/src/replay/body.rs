//! The actix side of the replay body: [`ReplayBody`] (the body adapter of the replay
//! core's [`CapturingBody`]) over an actix body read chunk by chunk ([`ActixChunks`]).

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project_lite::pin_project;
use tower_lock_core::{CapturingBody, Chunk, ChunkSource};

/// The response body of [`ReplayMiddleware`](super::ReplayMiddleware): the handler's body,
/// captured for replay while it streams to the client, or passed through untouched.
///
/// Dropped before its end (the client left mid-body), it reads the rest on the worker,
/// stores the response and releases the key.
pub struct ReplayBody<B: MessageBody + 'static> {
    kind: Kind<B>,
}

enum Kind<B> {
    Plain(Pin<Box<B>>),
    // Boxed: a capture is a few hundred bytes, a plain body a pointer.
    Capturing(Box<CapturingBody<ActixChunks<B>>>),
}

impl<B: MessageBody + 'static> ReplayBody<B> {
    pub(super) fn plain(body: B) -> Self {
        Self {
            kind: Kind::Plain(Box::pin(body)),
        }
    }

    pub(super) fn capturing(capturing: CapturingBody<ActixChunks<B>>) -> Self {
        Self {
            kind: Kind::Capturing(Box::new(capturing)),
        }
    }
}

impl<B: MessageBody + 'static> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayBody")
            .field("capturing", &matches!(self.kind, Kind::Capturing(_)))
            .finish_non_exhaustive()
    }
}

impl<B: MessageBody + 'static> MessageBody for ReplayBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        match &self.kind {
            Kind::Plain(body) => body.size(),
            Kind::Capturing(capturing) => capturing
                .source()
                .map_or(BodySize::Sized(0), |chunks| chunks.body.size()),
        }
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        match &mut self.get_mut().kind {
            Kind::Plain(body) => body.as_mut().poll_next(cx),
            Kind::Capturing(capturing) => capturing.poll_next(cx),
        }
    }
}

pin_project! {
    /// An actix body, read chunk by chunk by the replay core. Not nameable outside this
    /// crate.
    pub struct ActixChunks<B> {
        #[pin]
        body: B,
    }
}

impl<B> ActixChunks<B> {
    pub(super) fn new(body: B) -> Self {
        Self { body }
    }
}

impl<B> fmt::Debug for ActixChunks<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActixChunks").finish_non_exhaustive()
    }
}

impl<B: MessageBody> ChunkSource for ActixChunks<B> {
    type Item = Bytes;
    type Error = B::Error;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, B::Error>>> {
        self.project().body.poll_next(cx)
    }

    fn chunk(item: &Bytes) -> Chunk<'_> {
        Chunk::Data(item)
    }
}
