//! The transactional layer's steps for a response whose trailers decide (a gRPC status
//! after the messages): the engine-backed capture's policy and record codec, reached
//! through [`ReplayLocker`] so that the layer reuses them rather than copies them. Hidden:
//! the layer's, not an API.

use bytes::Bytes;

use super::{ReplayLocker, options::ReplayOptions, record_codec};

impl ReplayLocker {
    /// Whether a response head leaves the storing decision to its trailers (a gRPC
    /// response whose `grpc-status` is not in its head): the response is read to its
    /// trailers, and [`stores_trailers`](Self::stores_trailers) decides.
    #[doc(hidden)]
    pub fn decided_by_trailers(&self, headers: &http::HeaderMap) -> bool {
        ReplayOptions::decided_by_trailers(headers)
    }

    /// Whether a response with HTTP `status` whose head left the decision to its
    /// trailers is stored, as its `trailers`' `grpc-status` says (none: `UNKNOWN`), by
    /// the same policy as the engine-backed capture's.
    #[doc(hidden)]
    pub fn stores_trailers(&self, status: http::StatusCode, trailers: &http::HeaderMap) -> bool {
        let code = crate::grpc::status(trailers).unwrap_or(2);
        self.options.stores_grpc(code, status, trailers)
    }

    /// `meta` (from [`encode_response`](Self::encode_response)) with the response's
    /// `trailers` after its headers (the record kind a replay ends with its trailers),
    /// `None` when headers and trailers are over the limit.
    #[doc(hidden)]
    pub fn encode_with_trailers(&self, meta: &[u8], trailers: &http::HeaderMap) -> Option<Bytes> {
        record_codec::with_trailers(meta, trailers, self.options.max_response_headers)
    }
}
