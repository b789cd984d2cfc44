//! [`LockGuard`]: the lease a request runs under, from its grant to its release.

use std::fmt;
#[cfg(feature = "idempotency")]
use std::time::Duration;

use tokio::time::Instant;

use super::{AfterHead, Release, hold_log};
#[cfg(feature = "idempotency")]
use crate::engine::{LockError, Record};
use crate::{
    engine::Lease,
    lease_info::LeaseInfo,
    metrics::{HoldId, HolderSlot, LockMetrics, PermitInUse},
    options::ReleasePoint,
};

/// The lease a [`RequestLocker`](super::RequestLocker) took for one request (under the
/// degrade policy, both of its leases). [`LockGuard::release`] releases the key and
/// resolves when that is done; [`LockGuard::release_now`] and dropping it release in the
/// background. Each records the hold time. [`LockGuard::after_head`] decides which of them
/// a response calls for.
#[must_use = "dropping the guard releases the lease at once"]
pub struct LockGuard {
    lease: Option<Lease>,
    /// Under the degrade policy, the node-local lease taken before the backend's; released
    /// after it. Boxed: every other guard would otherwise carry its room, and a guard is
    /// moved a few times on its way to the response body.
    node: Option<Box<Lease>>,
    info: LeaseInfo,
    granted: Instant,
    metrics: LockMetrics,
    /// The layer's release point, which [`LockGuard::after_head`] follows.
    release: ReleasePoint,
    /// How the lease holds its key, as the layer's metrics know it: alone (this node's
    /// record of the holder, for a contender's `Retry-After`, cleared at release), or as a
    /// permit (counted in the permits gauge while the guard lives).
    held_as: HeldAs,
    /// Where the hold is among the layer's current holds (its gauges and log lines).
    hold: HoldId,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// When a [`LockGuard`]'s lease was granted, and where the layer's metrics keep its hold.
#[derive(Clone, Copy)]
pub(crate) struct Granted {
    pub(crate) at: Instant,
    pub(crate) hold: HoldId,
}

/// How a [`LockGuard`]'s lease holds its key, for the layer's metrics.
pub(crate) enum HeldAs {
    /// Alone: where this node's record of the holder is.
    Alone(HolderSlot),
    /// As one of a key's permits; the permits gauge counts it until dropped. `holder`: the
    /// record of the key's holder on this node, when this permit made it (taken alone, or
    /// the first of its shared holders here), cleared at release as the lock's.
    Permit {
        _in_use: PermitInUse,
        holder: Option<HolderSlot>,
    },
}

impl LockGuard {
    pub(crate) fn new(
        lease: Lease,
        node: Option<Lease>,
        info: LeaseInfo,
        granted: Granted,
        metrics: LockMetrics,
        release: ReleasePoint,
        held_as: HeldAs,
    ) -> Self {
        Self {
            lease: Some(lease),
            node: node.map(Box::new),
            info,
            granted: granted.at,
            metrics,
            release,
            held_as,
            hold: granted.hold,
        }
    }

    pub(crate) fn release_point(&self) -> ReleasePoint {
        self.release
    }

    /// What the handler may know about the lease.
    #[inline]
    pub fn info(&self) -> &LeaseInfo {
        &self.info
    }

    /// Release the key now, without waiting for the backend: the release is started at
    /// once (an in-process engine completes it on the spot) and, if the backend needs a
    /// round trip, finished on the engine's own runtime (never on the caller's, so this
    /// works outside any runtime). Response bodies call this before handing
    /// over their last frame, so a client that has read a whole response finds the key
    /// free for its next request (on Redis, the release is on its way first).
    pub fn release_now(self) {
        // In process, the drop releases on the spot, with the clock read that times the
        // hold: no future to make, box and poll, no runtime to enter, no second clock read.
        if self.lease.as_ref().is_some_and(Lease::releases_in_place)
            && self.node.as_deref().is_none_or(Lease::releases_in_place)
        {
            drop(self);
            return;
        }
        // Begun in order: its Redis call goes out on this runtime's connection, ahead of
        // the response's last frame and so of the client's next request through any node;
        // it finishes on the engine's own runtime (a lease dropped by user code goes out on
        // the engine's connections instead: `runtime::detach`).
        crate::engine::runtime::detach_in_order(self.release());
    }

    /// Release the key; the returned future resolves once the backend has applied the
    /// release (or failed to: the lease's TTL then frees the key). The release begins in
    /// this call and finishes even if the future is dropped: an in-process engine
    /// completes it on the spot (the future is ready at its first poll), a backend that
    /// needs a round trip finishes it on the engine's own runtime if this future is
    /// dropped first. A response with no body to send awaits this before its head is
    /// handed to the server, which never polls that body (see
    /// [`ReleasePoint::releases_before_response`](crate::ReleasePoint::releases_before_response)).
    pub fn release(mut self) -> impl Future<Output = ()> + Send + 'static {
        // Both releases begin here (`Lease::release` finishes once begun, whoever waits).
        let lease = self.lease.take().map(Lease::release);
        let node = self.node.take().map(|node| node.release());
        let key = self.info.key().clone();
        async move {
            for release in [lease, node].into_iter().flatten() {
                if let Err(error) = release.await {
                    tracing::debug!(%key, %error, "release did not apply");
                }
            }
        }
    }

    /// Decide what becomes of the lease now that the response head is known: `status`, and
    /// `no_body` when the response carries no body for a reason its status does not show
    /// (it answers a `HEAD` request, or its body is known to be empty). Follows the
    /// layer's [`ReleasePoint`](crate::ReleasePoint): see
    /// [`releases_with_response`](crate::ReleasePoint::releases_with_response) and
    /// [`releases_before_response`](crate::ReleasePoint::releases_before_response).
    #[inline]
    pub fn after_head(self, status: u16, no_body: bool) -> AfterHead {
        if status == 405 && self.metrics.wrapped_405() {
            // axum's `Router::route_layer` and actix's `Resource::wrap` also wrap the
            // route's own answer to a method it lacks, which nothing at request time tells
            // apart from a routed request: the wrong method took the key (or was refused
            // `400`/`423` for it) before that `405`.
            tracing::warn!(
                key = %self.info.key(),
                "a tower-lock layer took the lock for a request its service answered 405 Method Not Allowed: the lock wraps the route's wrong-method answer, so a wrong method can be answered 400 or 423 instead; install it per method (axum: post(handler).route_layer(lock), or Router::route_layer followed by .method_not_allowed_fallback(..); actix-web: web::post().to(handler).wrap(lock))"
            );
        }
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

    /// Store `record` and release the key in one atomic step
    /// ([`Lease::complete`](crate::Lease::complete)); under the degrade policy the
    /// node-local lease is released after it. Begins in this call and finishes even if the
    /// returned future is dropped (as [`LockGuard::release`]).
    #[cfg(feature = "idempotency")]
    pub(super) fn complete(
        mut self,
        record: Record,
        retention: Duration,
    ) -> impl Future<Output = Result<(), LockError>> + Send + 'static {
        let complete = self.lease.take().map(|l| l.complete(record, retention));
        let node = self.node.take();
        async move {
            let result = match complete {
                Some(complete) => complete.await,
                None => Ok(()),
            };
            if let Some(node) = node {
                let _ = node.release().await;
            }
            result
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // One clock read for the hold time and the lost check.
        let now = Instant::now();
        let held = now.saturating_duration_since(self.granted);
        let ended = self.metrics.held(self.hold, held);
        if let HeldAs::Alone(holder)
        | HeldAs::Permit {
            holder: Some(holder),
            ..
        } = &self.held_as
        {
            self.metrics.ended(*holder);
        }
        match &ended {
            // Found lost while the request ran: counted and logged then.
            Some(ended) if ended.already_lost => {}
            Some(ended) if self.info.is_lost_at(now) => {
                self.metrics.lost();
                hold_log::lost_while_held(&ended.facts, held);
            }
            Some(ended) => hold_log::released(&ended.facts, held, self.metrics.long_hold()),
            // Every guard's hold is registered at its grant.
            None => {}
        }
        // The clock read above serves the in-process engine's release too.
        if let Some(lease) = self.lease.take() {
            lease.drop_at(now);
        }
        if let Some(node) = self.node.take() {
            (*node).drop_at(now);
        }
    }
}
