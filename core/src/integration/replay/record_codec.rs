//! What a completed request leaves behind: the response head kept for replay (status and
//! the headers worth replaying), or the note that it completed without being kept.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

const VERSION: u8 = 1;
const KEPT: u8 = 0;
const NOT_KEPT: u8 = 1;

/// A record's metadata, decoded.
#[derive(Debug, PartialEq)]
pub(crate) enum Stored {
    /// The response was kept: replay it with this status and these headers (and the
    /// record's body).
    Response {
        status: StatusCode,
        headers: HeaderMap,
    },
    /// The request completed, but its response was too large (or had trailers) to keep.
    NotKept { status: u16 },
}

/// Headers that describe one connection or one message rather than the resource, plus
/// `Set-Cookie` (a session minted for the first caller must not be handed to whoever
/// retries), `Date` (the replay has its own) and `Content-Length` (recomputed from the
/// stored body).
fn replayable(name: &HeaderName, connection: &HeaderMap) -> bool {
    const DROPPED: [&str; 12] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "set-cookie",
        "date",
        "content-length",
    ];
    if DROPPED.contains(&name.as_str()) {
        return false;
    }
    // Headers the response itself declared hop-by-hop in `Connection`.
    !connection
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
}

/// The metadata of a kept response, or `None` when its replayable headers take more than
/// `max` bytes (names and values).
pub(crate) fn encode(status: StatusCode, headers: &HeaderMap, max: usize) -> Option<Bytes> {
    let mut out = BytesMut::with_capacity(64);
    out.put_u8(VERSION);
    out.put_u8(KEPT);
    out.put_u16(status.as_u16());
    let mut size = 0usize;
    for (name, value) in headers {
        if !replayable(name, headers) {
            continue;
        }
        size += name.as_str().len() + value.len();
        if size > max {
            return None;
        }
        out.put_u16(u16::try_from(name.as_str().len()).ok()?);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(u32::try_from(value.len()).ok()?);
        out.put_slice(value.as_bytes());
    }
    Some(out.freeze())
}

/// The metadata of a request that completed with `status` but whose response was not kept.
pub(crate) fn encode_not_kept(status: StatusCode) -> Bytes {
    let mut out = BytesMut::with_capacity(4);
    out.put_u8(VERSION);
    out.put_u8(NOT_KEPT);
    out.put_u16(status.as_u16());
    out.freeze()
}

/// Decode metadata written by [`encode`] or [`encode_not_kept`]; `None` if it is not
/// (another version, or damaged): such a record is never served.
pub(crate) fn decode(mut meta: &[u8]) -> Option<Stored> {
    if meta.remaining() < 4 || meta.get_u8() != VERSION {
        return None;
    }
    let kind = meta.get_u8();
    let status = meta.get_u16();
    if kind == NOT_KEPT {
        return meta.is_empty().then_some(Stored::NotKept { status });
    }
    if kind != KEPT {
        return None;
    }
    let status = StatusCode::from_u16(status).ok()?;
    let mut headers = HeaderMap::new();
    while meta.has_remaining() {
        if meta.remaining() < 2 {
            return None;
        }
        let n = usize::from(meta.get_u16());
        if meta.remaining() < n + 4 {
            return None;
        }
        let name = HeaderName::from_bytes(&meta[..n]).ok()?;
        meta.advance(n);
        let v = meta.get_u32() as usize;
        if meta.remaining() < v {
            return None;
        }
        let value = HeaderValue::from_bytes(&meta[..v]).ok()?;
        meta.advance(v);
        headers.append(name, value);
    }
    Some(Stored::Response { status, headers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_headers_round_trip_and_the_rest_are_dropped() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("location", "/orders/7"),
            ("etag", "\"v1\""),
            ("link", "</a>; rel=next"),
            ("link", "</b>; rel=prev"),
            ("content-type", "application/json"),
            ("cache-control", "no-store"),
            ("vary", "accept"),
            ("x-request-cost", "3"),
            ("set-cookie", "session=1"),
            ("date", "Sun, 22 Nov 2026 00:00:00 GMT"),
            ("content-length", "12"),
            ("transfer-encoding", "chunked"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
        ] {
            h.append(n, HeaderValue::from_static(v));
        }
        let meta = encode(StatusCode::CREATED, &h, 16 * 1024).unwrap();
        let Some(Stored::Response { status, headers }) = decode(&meta) else {
            panic!("decodes");
        };
        assert_eq!(status, StatusCode::CREATED);
        let names: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "location",
                "etag",
                "link",
                "content-type",
                "cache-control",
                "vary",
                "x-request-cost"
            ]
        );
        assert_eq!(headers.get_all("link").iter().count(), 2);
    }

    #[test]
    fn oversized_headers_and_damaged_metadata_are_refused() {
        let mut h = HeaderMap::new();
        h.insert("x-big", HeaderValue::from_str(&"a".repeat(100)).unwrap());
        assert!(encode(StatusCode::OK, &h, 50).is_none());
        let meta = encode(StatusCode::OK, &h, 200).unwrap();
        assert!(decode(&meta[..meta.len() - 1]).is_none());
        assert!(decode(b"").is_none());
        assert!(decode(&[9, 0, 0, 200]).is_none());
        assert_eq!(
            decode(&encode_not_kept(StatusCode::CREATED)),
            Some(Stored::NotKept { status: 201 })
        );
    }
}
