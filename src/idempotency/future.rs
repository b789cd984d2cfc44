//! [`ResponseFuture`], the future of an [`IdempotencyService`](super::IdempotencyService)
//! call.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use pin_project_lite::pin_project;
use tower_lock_core::{ReplayAdapter, ReplayFuture};

use super::adapter::TowerAdapter;

pin_project! {
    /// The future of an [`IdempotencyService`](super::IdempotencyService) call: the core's
    /// replay protocol driving one request (read, fingerprint, decide, run, capture).
    ///
    /// Dropping it (the client went away) gives up a read or a wait; a handler that already
    /// runs under its key runs on, so that its response is stored.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, ReqB>
    where
        TowerAdapter<S, ReqB>: ReplayAdapter,
    {
        #[pin]
        inner: ReplayFuture<TowerAdapter<S, ReqB>>,
    }
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    TowerAdapter<S, ReqB>: ReplayAdapter,
{
    pub(super) fn new(inner: ReplayFuture<TowerAdapter<S, ReqB>>) -> Self {
        Self { inner }
    }
}

impl<S, ReqB> fmt::Debug for ResponseFuture<S, ReqB>
where
    TowerAdapter<S, ReqB>: ReplayAdapter,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResponseFuture").field(&self.inner).finish()
    }
}

impl<S, ReqB> Future for ResponseFuture<S, ReqB>
where
    TowerAdapter<S, ReqB>: ReplayAdapter,
{
    type Output = Result<
        <TowerAdapter<S, ReqB> as ReplayAdapter>::Output,
        <TowerAdapter<S, ReqB> as ReplayAdapter>::Error,
    >;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}
