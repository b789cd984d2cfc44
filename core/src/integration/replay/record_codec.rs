//! What a completed request leaves behind: the response head kept for replay (status and
//! the headers worth replaying, and its trailers when it had some: every gRPC response
//! ends in trailers), or the note that it completed without being kept.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

const VERSION: u8 = 1;
const KEPT: u8 = 0;
const NOT_KEPT: u8 = 1;
/// Kept, with trailers: the header section's length, the headers, then the trailers.
const KEPT_WITH_TRAILERS: u8 = 2;

/// A record's metadata, decoded.
#[derive(Debug, PartialEq)]
pub(crate) enum Stored {
    /// The response was kept: replay it with this status and these headers (and the
    /// record's body).
    Response {
        status: StatusCode,
        headers: HeaderMap,
        /// Its trailers, if it had any.
        trailers: Option<HeaderMap>,
    },
    /// The request completed, but its response was too large to keep.
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

/// `meta` (written by [`encode`]) with the response's `trailers` after its headers, or
/// `None` when headers and trailers together take more than `max` bytes (names and values).
/// Every trailer is kept but the framing ones ([`replayable`]'s list), whatever `meta`'s
/// headers declared in `Connection`.
pub(crate) fn with_trailers(meta: &[u8], trailers: &HeaderMap, max: usize) -> Option<Bytes> {
    let section = meta.get(4..)?;
    let mut size: usize = header_bytes(section)?;
    let mut out = BytesMut::with_capacity(meta.len() + 64);
    out.put_u8(VERSION);
    out.put_u8(KEPT_WITH_TRAILERS);
    out.put_slice(&meta[2..4]);
    out.put_u32(u32::try_from(section.len()).ok()?);
    out.put_slice(section);
    let none = HeaderMap::new();
    for (name, value) in trailers {
        if !replayable(name, &none) {
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

/// The bytes (names and values) of an encoded header section, `None` if it is damaged.
fn header_bytes(section: &[u8]) -> Option<usize> {
    Some(
        decode_headers(section)?
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len())
            .sum(),
    )
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
    let status = StatusCode::from_u16(status).ok()?;
    match kind {
        KEPT => Some(Stored::Response {
            status,
            headers: decode_headers(meta)?,
            trailers: None,
        }),
        KEPT_WITH_TRAILERS => {
            if meta.remaining() < 4 {
                return None;
            }
            let n = meta.get_u32() as usize;
            if meta.remaining() < n {
                return None;
            }
            let (headers, trailers) = meta.split_at(n);
            Some(Stored::Response {
                status,
                headers: decode_headers(headers)?,
                trailers: Some(decode_headers(trailers)?),
            })
        }
        _ => None,
    }
}

/// A header section written by [`encode`] (after its first 4 bytes) or [`with_trailers`].
fn decode_headers(mut meta: &[u8]) -> Option<HeaderMap> {
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
    Some(headers)
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
        let Some(Stored::Response {
            status, headers, ..
        }) = decode(&meta)
        else {
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
    fn trailers_round_trip_after_the_headers() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t.insert("x-cost", HeaderValue::from_static("3"));
        let meta = encode(StatusCode::OK, &h, 100).unwrap();
        let meta = with_trailers(&meta, &t, 100).unwrap();
        assert_eq!(
            decode(&meta),
            Some(Stored::Response {
                status: StatusCode::OK,
                headers: h,
                trailers: Some(t.clone()),
            })
        );
        // Headers and trailers together within the limit, or nothing.
        let meta = encode(StatusCode::OK, &HeaderMap::new(), 20).unwrap();
        assert!(with_trailers(&meta, &t, 18).is_none());
        assert!(decode(&[1, 2, 0, 200, 0, 0, 0, 9]).is_none());
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
