//! The tower side of the replay lifecycle: an `http` response body shown to the replay
//! core ([`ChunkSource`]), and the spawner of the work a request leaves behind when its
//! client goes away.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame};
use pin_project_lite::pin_project;

use tower_lock_core::{Chunk, ChunkSource};

use crate::engine::runtime;

pin_project! {
    /// An `http_body` body, read frame by frame by the replay core: the
    /// [`ChunkSource`] of a tower response.
    pub struct HttpChunks<B> {
        #[pin]
        body: B,
    }
}

impl<B> HttpChunks<B> {
    /// `body`, read frame by frame.
    pub fn new(body: B) -> Self {
        Self { body }
    }

    /// The body.
    pub fn get_ref(&self) -> &B {
        &self.body
    }
}

impl<B> fmt::Debug for HttpChunks<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpChunks").finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes>> ChunkSource for HttpChunks<B> {
    type Item = Frame<Bytes>;
    type Error = B::Error;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn chunk(frame: &Frame<Bytes>) -> Chunk<'_> {
        if let Some(data) = frame.data_ref() {
            Chunk::Data(data)
        } else if let Some(trailers) = frame.trailers_ref() {
            Chunk::Trailers(trailers)
        } else {
            Chunk::Other
        }
    }

    fn is_end(&self) -> bool {
        self.body.is_end_stream()
    }
}

/// The handler's work belongs to the application's runtime, where it was started; the
/// engine's own runtime only when there is none.
pub(crate) fn spawn<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => drop(handle.spawn(future)),
        Err(_) => drop(runtime::handle().spawn(future)),
    }
}
