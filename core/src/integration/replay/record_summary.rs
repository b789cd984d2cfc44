//! [`RecordSummary`]: what a stored idempotency record says, read back for people and
//! tools (`tower-lock-cli record get`) without knowing how the replay protocol encodes it.

use super::record_codec::{Stored, decode};

/// The response an idempotency record stored: its status, and its headers and trailers
/// when the response was kept (a response too large to keep stores its status only).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordSummary {
    /// The response's status code.
    pub status: u16,
    /// Whether the response was kept (and is replayed); `false`: only its status, a retry
    /// is answered that it completed.
    pub kept: bool,
    /// The stored headers, in order (values that are not UTF-8 are shown lossily).
    pub headers: Vec<(String, String)>,
    /// The stored trailers, if the response had any.
    pub trailers: Option<Vec<(String, String)>>,
}

impl RecordSummary {
    /// Read a record's metadata ([`Record::meta`](tower_lock_engine::Record#structfield.meta));
    /// `None` for metadata of another version or damaged (never replayed either).
    pub fn decode(meta: &[u8]) -> Option<Self> {
        let pairs = |map: &http::HeaderMap| {
            map.iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect()
        };
        Some(match decode(meta)? {
            Stored::Response {
                status,
                headers,
                trailers,
            } => Self {
                status: status.as_u16(),
                kept: true,
                headers: pairs(&headers),
                trailers: trailers.as_ref().map(pairs),
            },
            Stored::NotKept { status } => Self {
                status,
                kept: false,
                headers: Vec::new(),
                trailers: None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::super::record_codec::{encode, encode_not_kept};
    use super::*;

    #[test]
    fn a_summary_reads_the_status_and_headers_the_replay_stored() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let meta = encode(StatusCode::CREATED, &h, 100).unwrap();
        assert_eq!(
            RecordSummary::decode(&meta),
            Some(RecordSummary {
                status: 201,
                kept: true,
                headers: vec![("content-type".into(), "application/json".into())],
                trailers: None,
            })
        );
        let not_kept = RecordSummary::decode(&encode_not_kept(StatusCode::OK)).unwrap();
        assert_eq!((not_kept.status, not_kept.kept), (200, false));
        assert_eq!(RecordSummary::decode(b"meta"), None);
    }
}
