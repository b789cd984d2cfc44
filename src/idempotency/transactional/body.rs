//! [`TransactionalBody`], the response body of a
//! [`TransactionalService`](super::TransactionalService).

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The response body of a [`TransactionalService`](super::TransactionalService): a
    /// response buffered and committed before its first byte is sent (a stored response,
    /// a replay, a rejection), the inner body untouched (an answer that was rolled back,
    /// a request the layer does not cover), or, for a response over the limits, the part
    /// read before its tombstone was committed followed by the rest.
    pub struct TransactionalBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full { data: Option<Bytes> },
        Plain { #[pin] body: B },
        Prefixed { prefix: Option<Bytes>, rest: Pin<Box<B>> },
    }
}

impl<B> TransactionalBody<B> {
    pub(super) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(super) fn plain(body: B) -> Self {
        Self {
            kind: Kind::Plain { body },
        }
    }

    pub(super) fn prefixed(prefix: Bytes, rest: Pin<Box<B>>) -> Self {
        Self {
            kind: Kind::Prefixed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                rest,
            },
        }
    }
}

impl<B> fmt::Debug for TransactionalBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Full { .. } => "full",
            Kind::Plain { .. } => "plain",
            Kind::Prefixed { .. } => "prefixed",
        };
        f.debug_tuple("TransactionalBody").field(&kind).finish()
    }
}

impl<B: Body<Data = Bytes>> Body for TransactionalBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Plain { body } => body.poll_frame(cx),
            KindProj::Prefixed { prefix, rest } => match prefix.take() {
                Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                None => rest.as_mut().poll_frame(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Plain { body } => body.is_end_stream(),
            Kind::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Plain { body } => body.size_hint(),
            Kind::Prefixed { prefix, rest } => {
                let extra = prefix.as_ref().map_or(0, |d| d.len() as u64);
                let hint = rest.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower() + extra);
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper + extra);
                }
                sum
            }
        }
    }
}
