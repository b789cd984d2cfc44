//! [`Outcome`]: what a [`RequestLocker`](super::RequestLocker) decided for a request.

use crate::reject::Rejection;

use super::LockGuard;

/// What a [`RequestLocker`](super::RequestLocker) decided for a request. Exhaustive: an
/// integration maps each of the three onto its framework, and needs no catch-all arm.
#[derive(Debug)]
pub enum Outcome {
    /// Run the request holding this lease; drop it when the response is done.
    Locked(LockGuard),
    /// Run the request without a lock (no key under the pass-through policy, or the
    /// backend failed under the fail-open policy).
    Unlocked,
    /// Answer with this rejection instead of running the request.
    Rejected(Rejection),
}
