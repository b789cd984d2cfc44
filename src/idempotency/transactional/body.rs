//! [`TransactionalBody`], the response body of a
//! [`TransactionalService`](super::TransactionalService).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tower_lock_core::ReplayedTrailers;

use super::protocol::Storing;

pin_project! {
    /// The response body of a [`TransactionalService`](super::TransactionalService): a
    /// response buffered and committed before its first byte is sent (a stored response,
    /// a replay, a rejection), with its trailers if it had any; the inner body untouched
    /// (an answer that was rolled back, a request the layer does not cover); for a
    /// response over the limits, the part read before its tombstone was committed
    /// followed by the rest; or, for a gRPC response over the limits, the part read and
    /// the rest with the transaction still open, until its trailers' `grpc-status`
    /// decides: they are sent once it committed or rolled back.
    pub struct TransactionalBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Plain { #[pin] body: B },
        Prefixed { prefix: Option<Bytes>, rest: Pin<Box<B>> },
        Deciding {
            prefix: Option<Bytes>,
            rest: Pin<Box<B>>,
            // Dropped before the trailers (the stream failed, ended without them, or its
            // client left): rolled back, as a status nobody saw.
            storing: Option<Storing>,
            // The commit or rollback the trailers decided, on a task of its own (it
            // finishes if this body is dropped): the trailers to send once it is done.
            decided: Option<oneshot::Receiver<HeaderMap>>,
        },
    }
}

impl<B> TransactionalBody<B> {
    pub(super) fn full(data: Bytes) -> Self {
        Self::with_trailers(data, None)
    }

    /// A whole body, then `trailers` (a stored response's, a replay's).
    pub(super) fn with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    /// An answer of the layer's own (a replay, a rejection), its stored trailers after
    /// its body: a replayed gRPC response's status is in them.
    pub(super) fn answer(mut res: http::Response<Bytes>) -> http::Response<Self> {
        let trailers = res
            .extensions_mut()
            .remove::<ReplayedTrailers>()
            .map(|t| t.0);
        res.map(|data| Self::with_trailers(data, trailers))
    }

    /// A gRPC response over the limits whose trailers decide: `prefix` (read), then
    /// `rest`, and at its trailers `storing` commits (a tombstone) or rolls back.
    pub(super) fn deciding(prefix: Bytes, rest: Pin<Box<B>>, storing: Storing) -> Self {
        Self {
            kind: Kind::Deciding {
                prefix: (!prefix.is_empty()).then_some(prefix),
                rest,
                storing: Some(storing),
                decided: None,
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
            Kind::Deciding { .. } => "deciding",
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
            KindProj::Full { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            KindProj::Plain { body } => body.poll_frame(cx),
            KindProj::Prefixed { prefix, rest } => match prefix.take() {
                Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
                None => rest.as_mut().poll_frame(cx),
            },
            KindProj::Deciding {
                prefix,
                rest,
                storing,
                decided,
            } => {
                if let Some(d) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                if decided.is_none() {
                    let frame = match std::task::ready!(rest.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => frame,
                        other => {
                            // No status: roll back (dropped), and pass the end on.
                            storing.take();
                            return Poll::Ready(other);
                        }
                    };
                    let trailers = match frame.into_trailers() {
                        Ok(trailers) => trailers,
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    };
                    let Some(storing) = storing.take() else {
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    };
                    *decided = Some(decide(storing, trailers));
                }
                let Some(receiver) = decided.as_mut() else {
                    return Poll::Ready(None);
                };
                let trailers = std::task::ready!(Pin::new(receiver).poll(cx));
                *decided = None;
                // A decision that never came (its task panicked): the stream ends without
                // a status, which its client reports as a failure.
                Poll::Ready(trailers.ok().map(|t| Ok(Frame::trailers(t))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Plain { body } => body.is_end_stream(),
            Kind::Prefixed { prefix, rest } => prefix.is_none() && rest.is_end_stream(),
            Kind::Deciding {
                prefix,
                rest,
                decided,
                ..
            } => prefix.is_none() && decided.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Plain { body } => body.size_hint(),
            Kind::Prefixed { prefix, rest } | Kind::Deciding { prefix, rest, .. } => {
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

/// Commit or roll back as `trailers` say, on a task of its own (a commit is not cancelled
/// by a client that leaves); the trailers to send once it is done: the response's, or on
/// a failed commit the rejection's gRPC status (`UNAVAILABLE`, `INTERNAL`) in their place,
/// since its head was sent already.
fn decide(storing: Storing, trailers: HeaderMap) -> oneshot::Receiver<HeaderMap> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let sent = match storing.commit(None, Some(&trailers)).await {
            Ok(()) => trailers,
            Err(answer) => {
                let (parts, _) = answer.into_parts();
                parts
                    .headers
                    .into_iter()
                    .filter_map(|(name, value)| Some((name?, value)))
                    .filter(|(name, _)| {
                        name.as_str().starts_with("grpc-") || name == http::header::RETRY_AFTER
                    })
                    .collect()
            }
        };
        let _ = tx.send(sent);
    });
    rx
}
