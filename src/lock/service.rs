//! [`LockService`], the service a [`LockLayer`](crate::LockLayer) wraps around another.

use std::task::{Context, Poll};

use http::{Method, Request, Response};
use tower_service::Service;

use super::{body::LockedBody, future::ResponseFuture};
use tower_lock_core::{Acquisition, Outcome, RequestLocker};

/// Runs the inner service while holding the request's lock; see the [crate docs](crate).
///
/// The inner service's error type is unchanged: rejections are responses, with a
/// [`LockedBody`] that carries either the rejection or the inner body plus the lease.
///
/// `poll_ready` is the inner service's. A request that must wait for its lock keeps the
/// inner service it was made ready on (clone-and-swap) until it is called, so a limiter
/// *inside* this layer counts waiting requests too; put concurrency or rate limits
/// outside it to count only requests that run.
#[derive(Clone, Debug)]
pub struct LockService<S> {
    inner: S,
    locker: RequestLocker,
}

impl<S> LockService<S> {
    pub(crate) fn new(inner: S, locker: RequestLocker) -> Self {
        Self { inner, locker }
    }

    crate::accessors::inner_service_accessors!();
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for LockService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: http_body::Body,
{
    type Response = Response<LockedBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // A response to HEAD has no body to send, whatever the inner service answers.
        let head = req.method() == Method::HEAD;
        match self.locker.start_acquisition(&req) {
            Acquisition::Decided(Outcome::Rejected(rejection)) => {
                ResponseFuture::rejected(self.locker.respond(rejection, &req))
            }
            // No key to wait for: call the ready inner service right away.
            Acquisition::Decided(Outcome::Unlocked) => {
                ResponseFuture::calling(self.inner.call(req), head, None)
            }
            // A dry run's request it would have rejected: unlocked, with its lease info.
            Acquisition::Decided(Outcome::Observed(info)) => {
                let mut req = req;
                req.extensions_mut().insert(info);
                ResponseFuture::calling(self.inner.call(req), head, None)
            }
            Acquisition::Decided(Outcome::Locked(held)) => {
                let mut req = req;
                req.extensions_mut().insert(held.info().clone());
                ResponseFuture::calling(self.inner.call(req), head, Some(held))
            }
            Acquisition::Pending(acquire) => {
                // The ready service is the one to call once the lock is ours; leave a
                // fresh clone behind, which must be driven to readiness on its own.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::acquiring(acquire, ready, req, self.locker.clone())
            }
        }
    }
}
