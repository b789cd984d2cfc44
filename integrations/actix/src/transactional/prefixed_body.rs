//! [`PrefixedBody`]: a response body over the record's limit, sent after its tombstone was
//! committed: the part read, then the rest.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;

/// The part of a body already read, then the rest of it.
pub(super) struct PrefixedBody<B> {
    prefix: Option<Bytes>,
    rest: Pin<Box<B>>,
}

impl<B> PrefixedBody<B> {
    pub(super) fn new(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        Self {
            prefix: (!prefix.is_empty()).then_some(prefix),
            rest,
        }
    }
}

impl<B: MessageBody> MessageBody for PrefixedBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        match self.prefix.take() {
            Some(prefix) => Poll::Ready(Some(Ok(prefix))),
            None => self.rest.as_mut().poll_next(cx),
        }
    }
}
