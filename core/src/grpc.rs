//! Rejections answered in gRPC: a request whose content type is `application/grpc` (or
//! `application/grpc+…`) is a gRPC call, and its client reads a status, not an HTTP error
//! page. tonic services are tower services, so the layer often sits in front of one.
//!
//! The answer is a "trailers-only" gRPC response, built here with no gRPC library: HTTP
//! `200`, `content-type: application/grpc`, `grpc-status` and `grpc-message` (the
//! rejection's detail, percent-encoded as the gRPC protocol asks), and the retry hint as
//! metadata: `retry-after` (whole seconds) and `grpc-retry-pushback-ms` (what gRPC's own
//! retry policy reads).
//!
//! | rejection | gRPC status |
//! |---|---|
//! | `Locked`, `Conflict` (held, not waiting) | `ABORTED` (10) |
//! | `TimedOut`, `QueueFull`, `RequestTooLarge` | `RESOURCE_EXHAUSTED` (8) |
//! | `BackendUnavailable` | `UNAVAILABLE` (14) |
//! | `MissingKey`, `MalformedKey`, `UnreadableBody` | `INVALID_ARGUMENT` (3) |
//! | `FingerprintMismatch`, `NotReplayable` | `FAILED_PRECONDITION` (9) |
//! | `Misconfigured` | `INTERNAL` (13) |
//!
//! gRPC-Web (`application/grpc-web…`) is not gRPC here: its rejections are HTTP answers,
//! and idempotency stores its response only when the status is in its head
//! ([`is_grpc_web_response`]): its status otherwise is in a frame inside its body.

use bytes::Bytes;
use http::{HeaderValue, header};

use crate::{
    key::RequestView,
    reject::{Rejection, RejectionKind},
};

/// Whether `req` is a gRPC call: its content type is `application/grpc`, alone or with a
/// `+format` suffix (`application/grpc+proto`).
pub(crate) fn is_grpc(req: &dyn RequestView) -> bool {
    req.header_str("content-type")
        .is_some_and(is_grpc_content_type)
}

/// The gRPC status of a response head or trailers (`grpc-status`), when the response is a
/// gRPC one (`content_type` given and `application/grpc…`, or `None` for trailers, which
/// only a gRPC response's head lets through here). An unreadable status is `UNKNOWN` (2),
/// as gRPC clients read it.
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
pub(crate) fn status(headers: &http::HeaderMap) -> Option<u32> {
    let value = headers.get("grpc-status")?;
    Some(
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(2),
    )
}

/// Whether a response head is a gRPC response's (`content-type: application/grpc…`).
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
pub(crate) fn is_grpc_response(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|ct| ct.to_str().ok())
        .is_some_and(is_grpc_content_type)
}

/// Whether a response head is a gRPC-Web response's (`content-type:
/// application/grpc-web…`, `application/grpc-web-text…`): gRPC for browsers, whose status
/// comes in its head (a trailers-only answer) or else in a trailer frame at the end of its
/// body, not in HTTP trailers.
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
pub(crate) fn is_grpc_web_response(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|ct| ct.to_str().ok())
        .is_some_and(|ct| {
            let ct = ct.trim_start();
            ct.len() >= 20 && ct[..20].eq_ignore_ascii_case("application/grpc-web")
        })
}

fn is_grpc_content_type(ct: &str) -> bool {
    let ct = ct.trim_start();
    ct.len() >= 16
        && ct[..16].eq_ignore_ascii_case("application/grpc")
        && matches!(ct.as_bytes().get(16), None | Some(b'+' | b';'))
}

/// What a gRPC status says for idempotency replay, as an HTTP status does: "try again"
/// (`CANCELLED`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `UNAVAILABLE`: never
/// stored, like `408`, `429`, `409`, `503`), a server error (`UNKNOWN`, `UNIMPLEMENTED`,
/// `INTERNAL`, `DATA_LOSS`, any code not defined: like a `5xx`), a request that could not
/// be processed as sent or lacked credentials (`INVALID_ARGUMENT`, `FAILED_PRECONDITION`,
/// `OUT_OF_RANGE`, `PERMISSION_DENIED`, `UNAUTHENTICATED`: like `400`, `403`, `401`, not
/// stored by default), or an answer (`OK`, `NOT_FOUND`, `ALREADY_EXISTS`).
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
pub(crate) fn meaning(code: u32) -> Meaning {
    match code {
        1 | 4 | 8 | 10 | 14 => Meaning::TryAgain,
        0 | 5 | 6 => Meaning::Answer,
        3 | 7 | 9 | 11 | 16 => Meaning::NotProcessed,
        _ => Meaning::ServerError,
    }
}

/// What a gRPC status says for idempotency replay (see [`meaning`]).
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Meaning {
    TryAgain,
    ServerError,
    NotProcessed,
    Answer,
}

/// The gRPC status code of a rejection.
fn code(kind: RejectionKind) -> u16 {
    match kind {
        RejectionKind::Locked | RejectionKind::Conflict => 10,
        RejectionKind::TimedOut | RejectionKind::QueueFull | RejectionKind::RequestTooLarge => 8,
        RejectionKind::BackendUnavailable => 14,
        RejectionKind::FingerprintMismatch | RejectionKind::NotReplayable => 9,
        RejectionKind::Misconfigured => 13,
        // The client's request: no key, a bad one, a body that failed; and any kind added
        // later until it is mapped.
        _ => 3,
    }
}

/// The trailers-only gRPC response for `rejection`.
pub(crate) fn response(rejection: &Rejection) -> http::Response<Bytes> {
    let mut res = http::Response::new(Bytes::new());
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(code(rejection.kind())));
    // Percent-encoded: only printable ASCII other than `%` goes as it is.
    let message = percent_encoding::utf8_percent_encode(rejection.detail(), MESSAGE).to_string();
    if let Ok(message) = HeaderValue::from_str(&message) {
        headers.insert("grpc-message", message);
    }
    if let Some(secs) = rejection.retry_after() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        headers.insert(
            "grpc-retry-pushback-ms",
            HeaderValue::from(secs.saturating_mul(1000)),
        );
    }
    res
}

/// What `grpc-message` percent-encodes (gRPC over HTTP/2: every byte outside `0x20..=0x7E`,
/// and `%`).
const MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        let req = |ct: &str| {
            http::Request::post("/pkg.Svc/Call")
                .header("content-type", ct)
                .body(())
                .unwrap()
        };
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC",
        ] {
            assert!(is_grpc(&req(ct)), "{ct}");
        }
        for ct in [
            "application/grpc-web",
            "application/json",
            "application/grp",
        ] {
            assert!(!is_grpc(&req(ct)), "{ct}");
        }
    }

    #[test]
    fn grpc_web_responses_are_told_by_their_content_type() {
        let head = |ct: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, ct.parse().unwrap());
            headers
        };
        for ct in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpc-web-text",
            "Application/gRPC-Web-Text+proto",
        ] {
            assert!(is_grpc_web_response(&head(ct)), "{ct}");
            assert!(!is_grpc_response(&head(ct)), "{ct}");
        }
        for ct in ["application/grpc", "application/json", "application/grpc-w"] {
            assert!(!is_grpc_web_response(&head(ct)), "{ct}");
        }
    }

    #[test]
    fn a_rejection_becomes_a_trailers_only_status_with_its_retry_hint() {
        let res = response(&Rejection::new(
            RejectionKind::Locked,
            "held: 100% busy".to_owned(),
            Some(std::time::Duration::from_millis(1500)),
        ));
        assert_eq!(res.status(), http::StatusCode::OK);
        let h = res.headers();
        assert_eq!(h["content-type"], "application/grpc");
        assert_eq!(h["grpc-status"], "10");
        assert_eq!(h["grpc-message"], "held: 100%25 busy");
        assert_eq!(h["retry-after"], "2");
        assert_eq!(h["grpc-retry-pushback-ms"], "2000");
        assert!(res.body().is_empty());
    }
}
