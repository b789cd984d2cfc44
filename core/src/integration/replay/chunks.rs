//! What a framework shows the replay core of a response body: a [`ChunkSource`] of
//! [`Chunk`]s, so that capturing and draining are written once for every framework.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

/// What one item of a response body carries for the record.
#[derive(Clone, Copy, Debug)]
pub enum Chunk<'a> {
    /// Body bytes.
    Data(&'a [u8]),
    /// The trailers: kept with the response, and replayed after its body (see
    /// [`ReplayedTrailers`](super::ReplayedTrailers)).
    Trailers(&'a http::HeaderMap),
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
