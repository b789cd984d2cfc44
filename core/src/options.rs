//! The layer's option enums: what to do with a request without a key
//! ([`MissingKeyPolicy`]), what to do when the backend fails ([`BackendFailurePolicy`]),
//! and when a request's lease is released ([`ReleasePoint`]).

/// What to do with a request that has no lock key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKeyPolicy {
    /// Answer `400 Bad Request`, explaining which key is missing (the default: a request
    /// that silently runs unprotected is the surprise to avoid).
    #[default]
    Reject,
    /// Run the request without a lock.
    PassThrough,
}

/// What to do when the lock backend fails (unreachable, timed out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendFailurePolicy {
    /// Answer `503 Service Unavailable` with `Retry-After` (the default).
    #[default]
    FailClosed,
    /// Run the request without a lock, logging a warning.
    FailOpen,
    /// Lock on an in-process engine instead: requests are still serialized per key on
    /// this node, not across the fleet. Logged as a warning, and visible to handlers as
    /// [`LeaseInfo::is_degraded`](crate::LeaseInfo::is_degraded): the in-process
    /// engine's fencing tokens are not comparable with the backend's, so storage that
    /// checks fences should not accept them as if they were.
    ///
    /// Under this policy every request takes the node-local lock first and the backend's
    /// second (keeping both), so the node-local lock alone serializes the node whatever
    /// the backend does: a request that holds a key on the backend excludes one that
    /// falls back while the backend stalls, and a degraded request excludes one that finds
    /// the backend back. Across nodes, only the backend's lock excludes: during an outage,
    /// two nodes may each run a request for one key. Every request tries the backend, so
    /// during an outage each pays the backend's timeout before falling back.
    Degrade,
}

/// When the lease of a request is released.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleasePoint {
    /// When the response body has been fully sent, or dropped (the default): a streamed
    /// response keeps its key until the last chunk. A response with no body to send (`204`,
    /// `304`, any answer to `HEAD`, an empty body) is released before its head is handed to
    /// the server, the release completed, so a client's next request never meets its own
    /// previous lease.
    #[default]
    BodyEnd,
    /// As soon as the inner service's response future completes, before the body is sent.
    ResponseReady,
}

impl ReleasePoint {
    /// Whether a response with this status code releases the key as it is returned rather
    /// than at the end of its body: under [`ReleasePoint::ResponseReady`], and always for
    /// `101 Switching Protocols` (an upgraded connection outlives its response and is not
    /// covered by the lock).
    pub fn releases_with_response(self, status: u16) -> bool {
        self == Self::ResponseReady || status == 101
    }

    /// Whether a response with this status is released before it is handed to the server,
    /// with the release completed rather than only begun
    /// ([`LockGuard::release`](crate::integration::LockGuard::release)): under
    /// [`ReleasePoint::BodyEnd`], a response with no body to send. A server never polls
    /// such a body, so its end would come only after the client has the response, and the
    /// client's next request could meet its own lease.
    ///
    /// `1xx`, `204 No Content` and `304 Not Modified` never carry a body; `no_body` says
    /// whether this response carries none for a reason its status does not show: it
    /// answers a `HEAD` request, or its body is known to be empty.
    pub fn releases_before_response(self, status: u16, no_body: bool) -> bool {
        !self.releases_with_response(status)
            && (no_body || (100..200).contains(&status) || status == 204 || status == 304)
    }
}
