//! [`ReplayOptions`]: what an idempotency layer stores and replays, as its builder checked
//! it, and the rule for which responses are stored.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode};

use super::{fingerprint::FingerprintKind, scope::Scope};

/// The user's say over which responses are stored (see
/// [`IdempotencyLayerBuilder::store_if`](crate::IdempotencyLayerBuilder::store_if)).
pub(crate) type StoreFn = Arc<dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync>;

/// The user's adjustment of replayed responses.
pub(crate) type ReplayHook = Arc<dyn Fn(&mut http::Response<Bytes>) + Send + Sync>;

/// The replay options, as the builder checked them.
pub(crate) struct ReplayOptions {
    pub(crate) replayed_header: HeaderName,
    pub(crate) store_server_errors: bool,
    pub(crate) max_response_body: usize,
    pub(crate) max_response_headers: usize,
    pub(crate) max_request_body: usize,
    pub(crate) retention: Duration,
    pub(crate) max_drain_time: Duration,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) fingerprint: FingerprintKind,
    pub(crate) store_if: Option<StoreFn>,
    pub(crate) on_replay: Option<ReplayHook>,
    pub(crate) scope: Scope,
}

impl ReplayOptions {
    /// Whether a response with this head is stored for replay. Answers that mean "this
    /// did not happen, try again" never are, whatever the user's predicate says: a
    /// replay would freeze a transient answer for the whole retention.
    pub(super) fn stores(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        let transient = matches!(status.as_u16(), 408 | 409 | 423 | 425 | 429 | 503)
            || (status.is_server_error() && !self.store_server_errors)
            || headers.contains_key(http::header::RETRY_AFTER);
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
}
