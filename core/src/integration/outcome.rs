//! [`Outcome`]: what a [`RequestLocker`](super::RequestLocker) decided for a request.

use crate::{lease_info::LeaseInfo, reject::Rejection};

use super::LockGuard;

/// What a [`RequestLocker`](super::RequestLocker) decided for a request. Exhaustive: an
/// integration maps each of the four onto its framework, and needs no catch-all arm.
#[derive(Debug)]
pub enum Outcome {
    /// Run the request holding this lease; drop it when the response is done.
    Locked(LockGuard),
    /// Run the request without a lock (no key under the pass-through policy, or the
    /// backend failed under the fail-open policy).
    Unlocked,
    /// A dry run's request that the layer would have rejected or made wait: run it
    /// unlocked, with this [`LeaseInfo`] in its extensions (as a locked request's), so
    /// that the handler answers as under the enforcing layer
    /// ([`LeaseInfo::is_dry_run`]: it locks nothing).
    Observed(LeaseInfo),
    /// Answer with this rejection instead of running the request.
    Rejected(Rejection),
}
