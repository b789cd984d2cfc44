//! [`TransactionalService`], the service a [`TransactionalLayer`](super::TransactionalLayer)
//! wraps around another, and its [`TransactionalFuture`].

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{TransactionalBody, flow, shared::Shared};
use crate::idempotency::RequestBody;

/// Runs the inner service in a database transaction that commits the idempotency record
/// with the handler's rows; see [`TransactionalLayer`](super::TransactionalLayer). The
/// inner service receives a [`RequestBody`], and the request's
/// [`LentTransaction`](super::LentTransaction) in its extensions.
#[derive(Clone)]
pub struct TransactionalService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for TransactionalService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalService")
            .field("inner", &self.inner)
            .field("records", &self.shared.tables.records())
            .finish_non_exhaustive()
    }
}

impl<S> TransactionalService<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwrap the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// The response future of a [`TransactionalService`].
pub struct TransactionalFuture<T, E> {
    inner: Pin<Box<dyn Future<Output = Result<T, E>> + Send>>,
}

impl<T, E> fmt::Debug for TransactionalFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalFuture")
            .finish_non_exhaustive()
    }
}

impl<T, E> Future for TransactionalFuture<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for TransactionalService<S>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Send,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send,
{
    type Response = Response<TransactionalBody<ResB>>;
    type Error = S::Error;
    type Future = TransactionalFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The ready service is the one to call once the key is claimed; leave a fresh
        // clone behind.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        TransactionalFuture {
            inner: Box::pin(flow::serve(Arc::clone(&self.shared), ready, req)),
        }
    }
}
