//! Rejections: why a request was turned away, and the `application/problem+json`
//! response (RFC 9457) that says so.
//!
//! A [`Rejection`] is framework-neutral: a status code, header name/value pairs (with
//! `Retry-After` already filled in) and a body. [`Rejection::into_response`] builds the
//! default `http` response; a hook set with
//! `LockLayerBuilder::on_reject` may build its own.
//!
//! | kind | status | `Retry-After` | when |
//! |---|---|---|---|
//! | [`MissingKey`](RejectionKind::MissingKey) | 400 | no | no key, and the policy requires one |
//! | [`MalformedKey`](RejectionKind::MalformedKey) | 400 | no | the key is malformed or too long |
//! | [`Misconfigured`](RejectionKind::Misconfigured) | 500 | no | the server's setup cannot derive the key (logged) |
//! | [`Conflict`](RejectionKind::Conflict) | 409 | yes | idempotency preset: the same key is in flight |
//! | [`Locked`](RejectionKind::Locked) | 423 | yes | the key is held and the layer does not wait |
//! | [`TimedOut`](RejectionKind::TimedOut) | 429 | yes | the wait limit passed |
//! | [`QueueFull`](RejectionKind::QueueFull) | 429 | yes | the key already has `max_waiters` waiters |
//! | [`BackendUnavailable`](RejectionKind::BackendUnavailable) | 503 | yes | the backend failed (fail-closed policy) |
//!
//! # gRPC calls
//!
//! A request whose content type is `application/grpc` is answered in gRPC instead (HTTP
//! `200`, `grpc-status`, `grpc-message`, the retry hint in `retry-after` and
//! `grpc-retry-pushback-ms`; the `on_reject` hook is for HTTP answers): `ABORTED` for a
//! held key (`423`, `409`), `RESOURCE_EXHAUSTED` for a wait that ran out, a full queue or a
//! body over the limit, `UNAVAILABLE` for a backend failure, `INVALID_ARGUMENT` for a
//! missing or malformed key (or a body that failed), `FAILED_PRECONDITION` for an
//! idempotency key reused with another request or a response not stored, `INTERNAL` for
//! the server's own setup.
//!
//! A hook that keeps the status and headers but answers in plain text:
//!
//! ```
//! use tower_lock::{LockEngine, LockLayer, key::PathKey};
//!
//! let layer = LockLayer::builder(LockEngine::in_memory())
//!     .key(PathKey)
//!     .on_reject(|rejection| {
//!         let mut res = http::Response::new(format!("{}\n", rejection.detail()).into());
//!         *res.status_mut() = rejection.status();
//!         for (name, value) in rejection.headers() {
//!             if name != "content-type" {
//!                 res.headers_mut().insert(name, value.parse().unwrap());
//!             }
//!         }
//!         res
//!     })
//!     .build()
//!     .unwrap();
//! # let _ = layer;
//! ```

use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use http::StatusCode;

/// The media type of rejection bodies.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Why a request was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The request has no lock key and the layer requires one (`400`).
    MissingKey,
    /// The request's lock key is malformed or too long (`400`).
    MalformedKey,
    /// A request with the same idempotency key is in flight (`409`).
    Conflict,
    /// The key is held and the layer does not wait (`423`).
    Locked,
    /// The request waited for its whole wait limit (`429`).
    TimedOut,
    /// The key already has the maximum number of waiters (`429`).
    QueueFull,
    /// The lock backend failed and the layer fails closed (`503`).
    BackendUnavailable,
    /// Idempotency replay: the key was used before with a different request (`422`).
    FingerprintMismatch,
    /// Idempotency replay: the request with this key completed, but its response was not
    /// kept (larger than the limits, or with trailers), so it cannot be replayed (`409`,
    /// with the original status in the problem's `original_status`; no `Retry-After`:
    /// retrying gets the same answer until the record's retention runs out).
    NotReplayable,
    /// Idempotency replay: the request body is larger than the layer fingerprints (`413`).
    RequestTooLarge,
    /// Idempotency replay: the request body could not be read to its end (`400`).
    UnreadableBody,
    /// The server's own setup cannot derive the request's lock key (a route parameter the
    /// route does not have, no principal from an authentication layer): `500`, with one
    /// throttled `error!` log naming the route and the cause.
    Misconfigured,
}

impl RejectionKind {
    pub(crate) const COUNT: usize = 12;

    /// Every kind, in [`index`](Self::index) order.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) const ALL: [Self; Self::COUNT] = [
        Self::MissingKey,
        Self::MalformedKey,
        Self::Conflict,
        Self::Locked,
        Self::TimedOut,
        Self::QueueFull,
        Self::BackendUnavailable,
        Self::FingerprintMismatch,
        Self::NotReplayable,
        Self::RequestTooLarge,
        Self::UnreadableBody,
        Self::Misconfigured,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    pub(crate) fn is_contention(self) -> bool {
        matches!(
            self,
            Self::Conflict | Self::Locked | Self::TimedOut | Self::QueueFull
        )
    }

    /// The HTTP status of this kind.
    pub fn status(self) -> StatusCode {
        match self {
            Self::MissingKey | Self::MalformedKey | Self::UnreadableBody => StatusCode::BAD_REQUEST,
            Self::Conflict | Self::NotReplayable => StatusCode::CONFLICT,
            Self::FingerprintMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Locked => StatusCode::LOCKED,
            Self::TimedOut | Self::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            Self::BackendUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable problem `type` URI of this kind (without a base set with
    /// `LockLayerBuilder::problem_type_base`):
    /// `urn:tower-lock:problem:` followed by [`slug`](Self::slug).
    pub fn type_uri(self) -> &'static str {
        match self {
            Self::MissingKey => "urn:tower-lock:problem:missing-key",
            Self::MalformedKey => "urn:tower-lock:problem:malformed-key",
            Self::Conflict => "urn:tower-lock:problem:conflict",
            Self::Locked => "urn:tower-lock:problem:locked",
            Self::TimedOut => "urn:tower-lock:problem:wait-timed-out",
            Self::QueueFull => "urn:tower-lock:problem:too-many-waiters",
            Self::BackendUnavailable => "urn:tower-lock:problem:lock-unavailable",
            Self::FingerprintMismatch => "urn:tower-lock:problem:fingerprint-mismatch",
            Self::NotReplayable => "urn:tower-lock:problem:response-not-stored",
            Self::RequestTooLarge => "urn:tower-lock:problem:request-too-large",
            Self::UnreadableBody => "urn:tower-lock:problem:unreadable-body",
            Self::Misconfigured => "urn:tower-lock:problem:misconfigured",
        }
    }

    /// The last segment of the problem `type`: `missing-key`, `malformed-key`, `conflict`,
    /// `locked`, `wait-timed-out`, `too-many-waiters`, `lock-unavailable`,
    /// `fingerprint-mismatch`, `response-not-stored`, `request-too-large`,
    /// `unreadable-body`, `misconfigured`.
    pub fn slug(self) -> &'static str {
        let uri = self.type_uri();
        &uri["urn:tower-lock:problem:".len()..]
    }

    /// The problem `title`: short, the same for every rejection of this kind.
    pub fn title(self) -> &'static str {
        match self {
            Self::MissingKey => "Lock key required",
            Self::MalformedKey => "Malformed lock key",
            Self::Conflict => "Request with this key already in progress",
            Self::Locked => "Resource locked",
            Self::TimedOut => "Timed out waiting for lock",
            Self::QueueFull => "Too many requests waiting for lock",
            Self::BackendUnavailable => "Lock service unavailable",
            Self::FingerprintMismatch => "Idempotency key reused with a different request",
            Self::NotReplayable => "Response of the original request was not stored",
            Self::RequestTooLarge => "Request body too large",
            Self::UnreadableBody => "Request body could not be read",
            Self::Misconfigured => "Lock key unavailable",
        }
    }

    /// The metric label of this kind (the `reason` of `tower_lock_rejected_total`): the
    /// problem type's [`slug`](Self::slug), e.g. `"too-many-waiters"`, so a dashboard, a
    /// log line and a client's problem body name a reason alike.
    pub fn as_str(self) -> &'static str {
        self.slug()
    }
}

impl fmt::Display for RejectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request turned away by the layer, with everything needed to answer it.
#[derive(Clone, Debug)]
pub struct Rejection {
    kind: RejectionKind,
    detail: String,
    retry_after: Option<u64>,
    /// The layer's base for problem types (`None`: the `urn:tower-lock:problem:` URNs).
    type_base: Option<Arc<str>>,
    /// The problem's `instance`: the request path.
    instance: Option<String>,
    /// [`RejectionKind::NotReplayable`]: the status of the original response.
    original_status: Option<u16>,
}

/// `Retry-After` in whole seconds: rounded to the nearest (a 2.003 s estimate is `2`, not
/// a second more), and never 0 (a client told "retry after 0" retries in a tight loop).
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.saturating_add(Duration::from_millis(500)).as_secs();
    secs.max(1)
}

impl Rejection {
    /// A rejection of `kind` explaining itself with `detail`; `retry_after` is rounded
    /// to whole seconds (at least 1) and sent as `Retry-After`.
    pub fn new(
        kind: RejectionKind,
        detail: impl Into<String>,
        retry_after: Option<Duration>,
    ) -> Self {
        Self {
            kind,
            detail: detail.into(),
            retry_after: retry_after.map(retry_after_secs),
            type_base: None,
            instance: None,
            original_status: None,
        }
    }

    #[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
    pub(crate) fn with_original_status(mut self, status: u16) -> Self {
        self.original_status = Some(status);
        self
    }

    /// [`RejectionKind::NotReplayable`]: the status the original request was answered with.
    pub fn original_status(&self) -> Option<u16> {
        self.original_status
    }

    /// Set the problem's `instance` (RFC 9457): the layer sets the request path.
    #[must_use]
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    pub(crate) fn with_type_base(mut self, base: Option<Arc<str>>) -> Self {
        self.type_base = base;
        self
    }

    /// The problem `type`: the layer's base followed by the kind's [slug](RejectionKind::slug)
    /// when a base is set, else the kind's `urn:tower-lock:problem:` URN.
    pub fn type_uri(&self) -> String {
        match &self.type_base {
            Some(base) => format!("{base}{}", self.kind.slug()),
            None => self.kind.type_uri().to_owned(),
        }
    }

    /// The problem's `instance`, when set: the path of the rejected request.
    pub fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    /// Why the request was rejected.
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The explanation for this occurrence (the problem's `detail`).
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// `Retry-After`, in whole seconds (never 0), when the client should retry.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// The response headers as name/value pairs: `content-type`, and `retry-after` when
    /// set. Framework integrations copy them onto their own response type.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![("content-type", PROBLEM_JSON.to_owned())];
        if let Some(secs) = self.retry_after {
            h.push(("retry-after", secs.to_string()));
        }
        h
    }

    /// The `application/problem+json` body: `type`, `title`, `status`, `detail`,
    /// `instance` (the request path), `retry_after` (seconds) and `original_status` when
    /// set.
    pub fn body(&self) -> Bytes {
        let mut v = serde_json::json!({
            "type": self.type_uri(),
            "title": self.kind.title(),
            "status": self.status().as_u16(),
            "detail": self.detail,
        });
        if let Some(instance) = &self.instance {
            v["instance"] = instance.as_str().into();
        }
        if let Some(secs) = self.retry_after {
            v["retry_after"] = secs.into();
        }
        if let Some(status) = self.original_status {
            v["original_status"] = status.into();
        }
        Bytes::from(v.to_string())
    }

    /// The default response: status, headers and problem+json body.
    pub fn into_response(self) -> http::Response<Bytes> {
        let mut res = http::Response::new(self.body());
        *res.status_mut() = self.status();
        let headers = res.headers_mut();
        for (name, value) in self.headers() {
            // Both are ASCII we built ourselves.
            headers.insert(
                name,
                http::HeaderValue::from_str(&value).expect("ASCII header value"),
            );
        }
        res
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.kind.title(),
            self.status().as_u16(),
            self.detail
        )
    }
}

impl std::error::Error for Rejection {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_kinds_are_listed_in_index_order() {
        for (i, kind) in RejectionKind::ALL.iter().enumerate() {
            assert_eq!(kind.index(), i);
        }
    }

    #[test]
    fn retry_after_rounds_to_the_nearest_second_and_is_never_zero() {
        let ms = Duration::from_millis;
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(ms(1)), 1);
        assert_eq!(retry_after_secs(ms(1000)), 1);
        assert_eq!(retry_after_secs(ms(1499)), 1);
        assert_eq!(retry_after_secs(ms(1500)), 2);
        assert_eq!(retry_after_secs(ms(2003)), 2);
    }

    #[test]
    fn response_carries_status_headers_and_problem_body() {
        let res = Rejection::new(
            RejectionKind::Locked,
            "held",
            Some(Duration::from_millis(2500)),
        )
        .into_response();
        assert_eq!(res.status(), StatusCode::LOCKED);
        assert_eq!(res.headers()["retry-after"], "3");
        assert_eq!(res.headers()["content-type"], PROBLEM_JSON);
        let body: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(body["type"], "urn:tower-lock:problem:locked");
        assert_eq!(body["status"], 423);
        assert_eq!(body["retry_after"], 3);
    }
}
