//! [`AfterHead`]: what becomes of a request's lease once its response head is known,
//! decided in one place for every framework.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use super::LockGuard;

/// What [`LockGuard::after_head`] decided for a request's lease, given its response head.
/// Each framework maps the three onto its own response types; none decides for itself.
#[derive(Debug)]
#[must_use = "a lease to hold must go into the response body, a release must be awaited"]
pub enum AfterHead {
    /// The lease was released as the response is returned (under
    /// [`ReleasePoint::ResponseReady`](crate::ReleasePoint::ResponseReady), and for
    /// `101 Switching Protocols`): hand the response over as it is.
    Released,
    /// The response has no body to send: await this release, then hand the response over.
    /// A server never polls such a body, so a release at its end would come only after the
    /// client has the response, and the client's next request could meet its own lease.
    ReleaseFirst(Release),
    /// Hold the lease until the response body ends: move it into the body, which releases
    /// it when its last chunk is taken, when it fails, or when it is dropped.
    HoldUntilBodyEnd(LockGuard),
}

impl LockGuard {
    /// Decide what becomes of the lease now that the response head is known: `status`, and
    /// `no_body` when the response carries no body for a reason its status does not show
    /// (it answers a `HEAD` request, or its body is known to be empty). Follows the
    /// layer's [`ReleasePoint`](crate::ReleasePoint): see
    /// [`releases_with_response`](crate::ReleasePoint::releases_with_response) and
    /// [`releases_before_response`](crate::ReleasePoint::releases_before_response).
    pub fn after_head(self, status: u16, no_body: bool) -> AfterHead {
        let release = self.release_point();
        if release.releases_with_response(status) {
            self.release_now();
            AfterHead::Released
        } else if release.releases_before_response(status, no_body) {
            AfterHead::ReleaseFirst(Release(Box::pin(self.release())))
        } else {
            AfterHead::HoldUntilBodyEnd(self)
        }
    }
}

/// A release under way ([`LockGuard::release`]): resolves once the backend has applied it.
/// It began when it was made, and finishes even if this future is dropped.
pub struct Release(Pin<Box<dyn Future<Output = ()> + Send + 'static>>);

impl fmt::Debug for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Release").finish_non_exhaustive()
    }
}

impl Future for Release {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}
