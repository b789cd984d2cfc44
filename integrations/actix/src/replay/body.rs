//! The actix side of the replay lifecycle: [`ReplayBody`] (the body adapter of the replay
//! core's [`CapturingBody`]), an actix response shown to the core ([`Handled`]), and the
//! spawner of the work a request leaves behind when its client goes away.

use std::{
    borrow::Cow,
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use actix_web::{
    body::{BodySize, MessageBody},
    dev::ServiceResponse,
};
use bytes::Bytes;
use pin_project_lite::pin_project;
use tower_lock::NotStored;
use tower_lock_core::{Capture, CapturingBody, Chunk, ChunkSource, ReplayResponse};

use crate::http_conversion::http_headers;

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

    pub(super) fn capturing(body: B, capture: Capture) -> Self {
        Self {
            kind: Kind::Capturing(Box::new(CapturingBody::new(
                ActixChunks { body },
                capture,
                spawn,
            ))),
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
    /// An actix body, read chunk by chunk by the replay core.
    pub(super) struct ActixChunks<B> {
        #[pin]
        body: B,
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

/// A handler's actix response, shown to the replay core.
pub(super) struct Handled<B>(pub(super) ServiceResponse<B>);

impl<B: MessageBody> ReplayResponse for Handled<B> {
    type Chunks = ActixChunks<B>;

    fn is_marked_not_stored(&self) -> bool {
        self.0.response().extensions().get::<NotStored>().is_some()
    }

    fn status(&self) -> http::StatusCode {
        http::StatusCode::from_u16(self.0.status().as_u16())
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn headers(&self) -> Cow<'_, http::HeaderMap> {
        Cow::Owned(http_headers(self.0.headers()))
    }

    fn into_chunks(self) -> ActixChunks<B> {
        ActixChunks {
            body: self.0.into_body(),
        }
    }
}

/// The handler's work stays on the worker that ran it (actix futures are not `Send`).
pub(super) fn spawn<F: Future<Output = ()> + 'static>(future: F) {
    drop(actix_web::rt::spawn(future));
}
