//! [`ReplayDecision`]: what [`ReplayLocker::begin`](super::ReplayLocker::begin) decided for
//! a request.

use bytes::Bytes;

use super::Completion;
use crate::reject::Rejection;

/// What [`ReplayLocker::begin`](super::ReplayLocker::begin) decided for a request.
#[derive(Debug)]
pub(crate) enum ReplayDecision {
    /// Run the handler holding the key; capture its response into the [`Completion`].
    Run(Completion),
    /// Run the handler without a lock and store nothing (the lock passed the request
    /// through).
    Unlocked,
    /// Answer with this stored response (its `Idempotent-Replayed` header included).
    Replay(http::Response<Bytes>),
    /// Answer with this rejection (see [`ReplayLocker::respond`](super::ReplayLocker::respond)).
    Rejected(Rejection),
}
