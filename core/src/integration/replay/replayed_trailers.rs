//! [`ReplayedTrailers`]: the trailers of a stored response, handed to a framework with its
//! replay.

use http::HeaderMap;

/// The trailers a stored response ended with (every gRPC response does: its
/// `grpc-status` is in them), in the extensions of its replay
/// ([`ReplayAdapter::respond`](super::ReplayAdapter::respond)'s response): a framework
/// whose bodies carry trailers sends them after the replayed body. Without them a gRPC
/// client reading the replay would find no status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayedTrailers(pub HeaderMap);
