//! [`ReplayOptions`]: what an idempotency layer stores and replays, as its builder checked
//! it, and the rule for which responses are stored.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode};

use super::{fingerprint::FingerprintKind, scope::Scope};
use crate::{
    ConfigError,
    engine::MAX_TTL,
    grpc::{self, Meaning},
};

/// The user's say over which responses are stored (see
/// `IdempotencyLayerBuilder::store_if`).
pub type StoreFn = Arc<dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync>;

/// The user's adjustment of replayed responses.
pub type ReplayHook = Arc<dyn Fn(&mut http::Response<Bytes>) + Send + Sync>;

/// The replay options, as the builder checked them.
// Reached only through the hidden `settings` module, by tower-lock's builders: not an API
// of this crate.
#[allow(missing_docs, missing_debug_implementations)]
pub struct ReplayOptions {
    pub replayed_header: HeaderName,
    pub store_server_errors: bool,
    pub max_response_body: usize,
    pub max_response_headers: usize,
    pub max_request_body: usize,
    pub retention: Duration,
    pub max_drain_time: Duration,
    pub fingerprint_headers: Vec<HeaderName>,
    pub fingerprint: FingerprintKind,
    pub store_if: Option<StoreFn>,
    pub on_replay: Option<ReplayHook>,
    pub scope: Scope,
}

impl ReplayOptions {
    /// The limits are above zero, the retention at most [`MAX_TTL`].
    pub fn check(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("max_request_body", self.max_request_body),
            ("max_response_body", self.max_response_body),
            ("max_response_headers", self.max_response_headers),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroLimit(name));
            }
        }
        if self.retention < Duration::from_millis(1) {
            return Err(ConfigError::ZeroLimit("retention"));
        }
        if self.max_drain_time.is_zero() {
            return Err(ConfigError::ZeroLimit("max_drain_time"));
        }
        if self.retention > MAX_TTL {
            return Err(ConfigError::TooLong("retention"));
        }
        Ok(())
    }

    /// Whether a response with this head is stored for replay. The status alone says
    /// whether an answer means "this did not happen, try again": those are never stored,
    /// whatever the user's predicate says, since a replay would freeze a transient answer
    /// for the whole retention. A `Retry-After` counts only on them (it tells a `5xx`
    /// stored by `store_server_errors` from a lasting one); on a `2xx` it is the
    /// asynchronous job's "poll again later", and that job exists: its retry must be
    /// answered with the stored `202`, not queue a second job. The user's predicate is
    /// asked about everything else.
    ///
    /// A gRPC response (`content-type: application/grpc…`) answers HTTP `200` whatever
    /// happened: its `grpc-status` decides as an HTTP status would (see
    /// [`grpc::meaning`]): in its head for a trailers-only answer; else in its trailers,
    /// after the messages, so such a head is captured and the trailers decide
    /// ([`Capture::trailers`](super::Capture::trailers) asks
    /// [`stores_grpc`](Self::stores_grpc) with them).
    ///
    /// A gRPC-Web response (`application/grpc-web…`) is judged by the `grpc-status` of
    /// its head, when it is a trailers-only answer. Otherwise its status is in a trailer
    /// frame at the end of its body (base64 text for `grpc-web-text`), which the layer
    /// does not parse: its HTTP `200` says nothing (a failure has it too), so it is not
    /// stored, rather than a "try again" replayed for the whole retention. The key is
    /// released, and a retry runs again.
    pub(super) fn stores(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        if grpc::is_grpc_web_response(headers) {
            return grpc::status(headers)
                .is_some_and(|code| self.stores_grpc(code, status, headers));
        }
        if grpc::is_grpc_response(headers) {
            return match grpc::status(headers) {
                Some(code) => self.stores_grpc(code, status, headers),
                None => true,
            };
        }
        let transient = matches!(status.as_u16(), 408 | 409 | 423 | 425 | 429 | 503)
            || (status.is_server_error()
                && (!self.store_server_errors || headers.contains_key(http::header::RETRY_AFTER)));
        if transient {
            return false;
        }
        match &self.store_if {
            Some(store_if) => store_if(status, headers),
            // A request that could not be processed as sent (an extractor's `400`, `413`,
            // `415` or `422`: nothing happened, as Stripe keeps nothing when validation
            // fails), or an answer about credentials (the retry after logging in must run).
            None => !matches!(status.as_u16(), 400 | 401 | 403 | 407 | 413 | 415 | 422),
        }
    }

    /// Whether a response head leaves the storing decision to its trailers: a gRPC
    /// response whose `grpc-status` is not in its head.
    pub(super) fn decided_by_trailers(headers: &HeaderMap) -> bool {
        grpc::is_grpc_response(headers) && grpc::status(headers).is_none()
    }

    /// [`stores`](Self::stores) for a gRPC status `code`, read from `headers` (a
    /// trailers-only head, or the trailers) of a response with HTTP `status`.
    pub(super) fn stores_grpc(&self, code: u32, status: StatusCode, headers: &HeaderMap) -> bool {
        let retry_hint = headers.contains_key(http::header::RETRY_AFTER)
            || headers.contains_key("grpc-retry-pushback-ms");
        match grpc::meaning(code) {
            Meaning::TryAgain => false,
            Meaning::ServerError if !self.store_server_errors || retry_hint => false,
            meaning => match &self.store_if {
                Some(store_if) => store_if(status, headers),
                None => meaning != Meaning::NotProcessed,
            },
        }
    }
}
