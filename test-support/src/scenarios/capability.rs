//! What a backend must do for a scenario to hold there, and which backends do not yet:
//! [`Capability`] for the tests that ask at run time ([`Backend::has`]), and
//! [`if_backend_has!`](crate::if_backend_has) for the macros, which leave a scenario out of
//! a backend that lacks what it needs rather than run it to a known failure.
//!
//! The two lists are one table: a backend gains a capability by leaving both.

use super::Backend;

/// Something a scenario needs of the backend beyond the exclusive lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// Shared leases: permits and `shared_for`. Postgres answers `Unsupported` until its
    /// backend (`engine/src/postgres`) grants them.
    SharedLeases,
    /// A release begun as a response ends reaches the backend before the same node's next
    /// call for the key, so a client's next request never meets the lease its previous
    /// response let go. Redis has it from its one multiplexed connection per node (commands
    /// applied in the order sent), the in-process backend by releasing on the spot.
    /// Postgres not yet: each call is a task of its own on a pooled connection, so the next
    /// request's acquire can overtake the release (seen as a `423`; an idempotency retry
    /// answered `409` after a `503`, or `409` where its stored response was due). The fix belongs in its backend: an acquire waits for
    /// the node's releases of its key still in flight.
    OrderedReleases,
}

impl Backend {
    /// Whether the backend has `capability` (in step with
    /// [`if_backend_has!`](crate::if_backend_has)).
    pub fn has(self, capability: Capability) -> bool {
        let _ = capability;
        #[cfg(feature = "postgres")]
        if matches!(self, Self::Postgres | Self::PostgresBouncer) {
            return false;
        }
        true
    }
}

/// The items after the backend, unless the backend lacks the capability (in step with
/// [`Backend::has`]): how the scenario macros leave a scenario out of a backend that cannot
/// pass it yet.
///
/// ```ignore
/// tower_lock_test_support::if_backend_has!(SharedLeases, Postgres, every_case!(Postgres););
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! if_backend_has {
    (SharedLeases, Postgres, $($items:tt)*) => {};
    (SharedLeases, PostgresBouncer, $($items:tt)*) => {};
    (OrderedReleases, Postgres, $($items:tt)*) => {};
    (OrderedReleases, PostgresBouncer, $($items:tt)*) => {};
    ($capability:ident, $backend:ident, $($items:tt)*) => {
        $($items)*
    };
}
