//! [`TransactionalService`], the service a [`TransactionalLayer`](super::TransactionalLayer)
//! wraps around another, and its [`TransactionalFuture`].

use std::{
    fmt,
    future::Future,
    panic::{self, AssertUnwindSafe},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use tracing::Instrument;

use super::{RunsOn, TransactionalBody, flow, shared::Shared};
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

    crate::accessors::inner_service_accessors!();
}

/// The response future of a [`TransactionalService`]. Dropped after the handler began (its
/// client left, or a timeout outside the layer fired), the request is not cancelled: the
/// rest runs on a task of its own to its commit or rollback (see
/// [`RunsOn`]), as the engine-backed idempotency layer's does, so the retry gets the
/// replay.
pub struct TransactionalFuture<T, E> {
    /// `None` once it completed or panicked (a panicked future is never polled again).
    inner: Option<Pin<Box<dyn Serving<T, E>>>>,
    runs_on: RunsOn,
    /// The span the request was called in, for the logs of a request that runs on.
    span: tracing::Span,
}

impl<T, E> fmt::Debug for TransactionalFuture<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalFuture")
            .field("runs_on", &self.runs_on)
            .finish_non_exhaustive()
    }
}

impl<T, E> Future for TransactionalFuture<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.inner.as_mut().expect("polled after completion");
        match panic::catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => {
                self.inner = None;
                Poll::Ready(out)
            }
            Err(panic) => {
                // The handler panicked: never run on. Dropping the request's state drops
                // its transaction, which rolls back; the panic goes on to the server.
                self.inner = None;
                panic::resume_unwind(panic)
            }
        }
    }
}

impl<T, E> Drop for TransactionalFuture<T, E> {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        if !self.runs_on.client_left() {
            // Before the handler: nothing happened yet, and nothing runs on.
            return;
        }
        // Without a runtime nothing can run on: dropped, the transaction is closed with
        // its connection, which rolls it back.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let span = std::mem::replace(&mut self.span, tracing::Span::none());
            inner.run_on(&runtime, span);
        }
    }
}

/// The request's serving future, which can go on on a task of its own (the bounds a task
/// needs are known where it is made, not in `Drop`).
trait Serving<T, E>: Future<Output = Result<T, E>> + Send {
    /// Run the rest on `runtime`, in `span`, its answer dropped (no client waits for it).
    fn run_on(self: Pin<Box<Self>>, runtime: &tokio::runtime::Handle, span: tracing::Span);
}

impl<F, T, E> Serving<T, E> for F
where
    F: Future<Output = Result<T, E>> + Send + 'static,
{
    fn run_on(self: Pin<Box<Self>>, runtime: &tokio::runtime::Handle, span: tracing::Span) {
        // A panic on the task drops the transaction (rolled back); tokio reports it.
        runtime.spawn(
            async move {
                let _ = self.await;
            }
            .instrument(span),
        );
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
        let runs_on = RunsOn::new();
        let serve = flow::serve(Arc::clone(&self.shared), ready, req, runs_on.clone());
        TransactionalFuture {
            inner: Some(Box::pin(serve)),
            runs_on,
            span: tracing::Span::current(),
        }
    }
}
