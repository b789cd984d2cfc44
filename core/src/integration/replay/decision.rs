//! [`ReplayDecision`]: what [`ReplayLocker::begin`](super::ReplayLocker::begin) decided for
//! a request.

use bytes::Bytes;

use super::Completion;
use crate::{lease_info::LeaseInfo, reject::Rejection};

/// What [`ReplayLocker::begin`](super::ReplayLocker::begin) decided for a request.
#[derive(Debug)]
pub(crate) enum ReplayDecision {
    /// Run the handler holding the key; capture its response into the [`Completion`].
    Run(Completion),
    /// Run the handler without a lock and store nothing (the lock passed the request
    /// through); with a dry run's lease info for its extensions when the layer only
    /// observes (see [`Outcome::Observed`](crate::integration::Outcome::Observed)).
    Unlocked(Option<LeaseInfo>),
    /// Answer with this stored response (its `Idempotent-Replayed` header included).
    Replay(http::Response<Bytes>),
    /// Answer with this rejection (see [`ReplayLocker::respond`](super::ReplayLocker::respond)).
    Rejected(Rejection),
}
