//! [`Completion`]: a request that runs under its idempotency key, until its response is
//! captured.

use std::fmt;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};

use super::{
    Capture, ReplayAdapter, ReplayLocker, capture::State, options::ReplayOptions, record_codec,
};
use crate::{integration::LockGuard, lease_info::LeaseInfo};

/// A request running under its key: turn its response into a [`Capture`] with
/// [`capture`](Self::capture). Dropping it (the handler failed or panicked) releases the
/// key and stores nothing, so a retry runs again.
#[must_use = "dropping it releases the key and stores nothing"]
pub(crate) struct Completion {
    pub(super) guard: LockGuard,
    pub(super) fingerprint: Bytes,
    pub(super) replay: ReplayLocker,
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("lease", self.guard.info())
            .finish_non_exhaustive()
    }
}

impl Completion {
    pub(super) fn new(guard: LockGuard, fingerprint: Bytes, replay: ReplayLocker) -> Self {
        Self {
            guard,
            fingerprint,
            replay,
        }
    }

    /// The lease the request runs under.
    pub(crate) fn info(&self) -> &LeaseInfo {
        self.guard.info()
    }

    /// Start capturing the response with this status and headers. A response that is
    /// not stored (one whose status means "try again": `408`, `409`, `423`, `425`, `429`,
    /// `503`, other `5xx` unless the layer stores them without `Retry-After`; by default
    /// `400`, `401`, `403`, `407`, `413`, `415`, `422`; whatever the layer's `store_if`
    /// refuses) is not captured: the
    /// key is released at the end of the body, with no record, and a retry runs again.
    pub(crate) fn capture(self, status: StatusCode, headers: &HeaderMap) -> Capture {
        let o = &self.replay.options;
        let state = if !o.stores(status, headers) {
            State::Release
        } else {
            match record_codec::encode(status, headers, o.max_response_headers) {
                Some(meta) => State::Keep {
                    status,
                    meta,
                    body: BytesMut::new(),
                    by_trailers: ReplayOptions::decided_by_trailers(headers),
                },
                None => State::NotKept { status },
            }
        };
        Capture::new(self, state)
    }

    /// Run the response through without storing it: the key is released at the end of
    /// its body, and a retry runs again. For a response that carries the
    /// [`NotStored`](crate::NotStored) mark.
    pub(crate) fn not_stored(self) -> Capture {
        Capture::new(self, State::Release)
    }

    /// The capture of `response`, by its head: [`not_stored`](Self::not_stored) for a
    /// response marked [`NotStored`](crate::NotStored), else [`capture`](Self::capture)
    /// with its status and headers.
    pub(super) fn capture_response<A: ReplayAdapter>(self, response: &A::Response) -> Capture {
        if A::is_marked_not_stored(response) {
            self.not_stored()
        } else {
            self.capture(A::status(response), &A::headers(response))
        }
    }
}
