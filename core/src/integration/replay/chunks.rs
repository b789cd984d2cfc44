//! What a framework shows the replay core of a response: [`ReplayResponse`] (its head, and
//! its body as a [`ChunkSource`]), so that capturing, keeping the handler running and
//! draining are written once for every framework.

use std::{
    borrow::Cow,
    pin::Pin,
    task::{Context, Poll},
};

use http::{HeaderMap, StatusCode};

/// What one item of a response body carries for the record.
#[derive(Clone, Copy, Debug)]
pub enum Chunk<'a> {
    /// Body bytes.
    Data(&'a [u8]),
    /// The trailers: a response that has them is not kept (a replay could not reproduce
    /// them).
    Trailers,
    /// Anything else a body may yield: not part of the record.
    Other,
}

/// A response body as the replay core reads it: a framework's body behind a small
/// adapter, yielding the framework's own items (an `http_body::Frame`, actix's `Bytes`)
/// so that they pass on to the client unchanged.
pub trait ChunkSource {
    /// What the framework's body yields.
    type Item;
    /// How it fails. A body that fails stores nothing: the retry runs again.
    type Error;

    /// The next item, `None` at the end of the body.
    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Self::Item, Self::Error>>>;

    /// What `item` carries for the record.
    fn chunk(item: &Self::Item) -> Chunk<'_>;

    /// Whether the body is known to have ended (checked after each item, so that a body
    /// that knows its end is stored before its last item is handed over). Default: only
    /// its `None` says so.
    fn is_end(&self) -> bool {
        false
    }
}

/// A framework's response, as the replay core captures it: the head decides what is
/// stored, the body is read as a [`ChunkSource`]. A framework implements it for its
/// response type, converting its own status and header types (`http` 0.2 for actix).
pub trait ReplayResponse {
    /// The body, read chunk by chunk.
    type Chunks: ChunkSource;

    /// Whether the response carries the [`NotStored`](crate::NotStored) mark.
    fn is_marked_not_stored(&self) -> bool;

    /// The status.
    fn status(&self) -> StatusCode;

    /// The headers, as `http` 1 headers.
    fn headers(&self) -> Cow<'_, HeaderMap>;

    /// The body.
    fn into_chunks(self) -> Self::Chunks;
}
