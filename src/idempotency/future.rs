//! [`IdempotencyFuture`], the future of an [`IdempotencyService`](super::IdempotencyService)
//! call.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use http::Response;
use pin_project_lite::pin_project;

use super::replay_body::ReplayBody;
use crate::engine::BoxFuture;

/// What an [`IdempotencyFuture`] resolves to.
pub(super) type Output<ResB, E> = Result<Response<ReplayBody<ResB>>, E>;

pin_project! {
    /// The future of an [`IdempotencyService`](super::IdempotencyService) call.
    pub struct IdempotencyFuture<F, ResB, E> {
        #[pin]
        kind: FutureKind<F, ResB, E>,
    }
}

pin_project! {
    #[project = FutureKindProj]
    enum FutureKind<F, ResB, E> {
        // A request the layer does not cover.
        Pass { #[pin] future: F },
        // Read, fingerprint, decide, run, capture.
        Boxed { future: BoxFuture<'static, Output<ResB, E>> },
        Ready { response: Option<Response<ReplayBody<ResB>>> },
    }
}

impl<F, ResB, E> IdempotencyFuture<F, ResB, E> {
    pub(super) fn pass(future: F) -> Self {
        Self {
            kind: FutureKind::Pass { future },
        }
    }

    pub(super) fn boxed(future: BoxFuture<'static, Output<ResB, E>>) -> Self {
        Self {
            kind: FutureKind::Boxed { future },
        }
    }

    pub(super) fn ready(response: Response<ReplayBody<ResB>>) -> Self {
        Self {
            kind: FutureKind::Ready {
                response: Some(response),
            },
        }
    }
}

impl<F, ResB, E> fmt::Debug for IdempotencyFuture<F, ResB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyFuture").finish_non_exhaustive()
    }
}

impl<F, ResB, E> Future for IdempotencyFuture<F, ResB, E>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Output<ResB, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            FutureKindProj::Pass { future } => {
                let res = ready!(future.poll(cx))?;
                Poll::Ready(Ok(res.map(ReplayBody::plain)))
            }
            FutureKindProj::Boxed { future } => future.as_mut().poll(cx),
            FutureKindProj::Ready { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
        }
    }
}
