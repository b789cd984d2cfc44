//! [`IdempotencyService`], the service an [`IdempotencyLayer`](super::IdempotencyLayer)
//! wraps around another: each request goes to the core's replay protocol
//! ([`ReplayLocker::serve`]) behind the tower adapter.

use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_lock_core::ReplayLocker;
use tower_service::Service;

use super::{
    adapter::TowerAdapter, future::ResponseFuture, replay_body::ReplayBody,
    request_body::RequestBody,
};

/// Runs the inner service at most once per idempotency key, and replays its stored
/// response to retries; see [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// The inner service receives a [`RequestBody`]: the body the layer read to fingerprint
/// the request (or, for a method the layer does not cover, the original one). Axum's
/// routers and handlers accept it as they accept any body.
#[derive(Clone, Debug)]
pub struct IdempotencyService<S> {
    inner: S,
    replay: ReplayLocker,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, replay: ReplayLocker) -> Self {
        Self { inner, replay }
    }

    crate::accessors::inner_service_accessors!();
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<ReplayBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The ready service is the one to call once the body is read and the key is ours;
        // leave a fresh clone behind.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(self.replay.serve(TowerAdapter::new(ready, req)))
    }
}
