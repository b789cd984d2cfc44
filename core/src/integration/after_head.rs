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

/// A release under way ([`LockGuard::release`]): resolves once the backend has applied it.
/// It began when it was made, and finishes even if this future is dropped.
pub struct Release(pub(super) Pin<Box<dyn Future<Output = ()> + Send + 'static>>);

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
