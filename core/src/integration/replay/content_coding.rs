//! [`AcceptedCodings`]: the content codings a retry accepts, so that a stored response
//! compressed for the first request (a compression layer inside the idempotency layer)
//! is never replayed to a retry that did not ask for its encoding.
//!
//! The first request's `Accept-Encoding` is not part of the fingerprint (a retry may come
//! from another client library), so the check is made when replaying: the stored
//! `Content-Encoding` must be one the retry accepts (RFC 9110, 12.5.3: by name or `*`,
//! with a weight above zero; `identity` always, unless refused). A request without
//! `Accept-Encoding` accepts `identity` only, as compression layers read it.

use http::{HeaderMap, header};

use crate::key::RequestView;

/// The `Accept-Encoding` of a request, kept for the replay decision.
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct AcceptedCodings {
    /// Every value of the header, joined by commas (empty: none sent).
    header: String,
}

impl AcceptedCodings {
    /// What `req` accepts.
    pub(crate) fn of(req: &dyn RequestView) -> Self {
        let mut header = String::new();
        for value in req.header_values("accept-encoding") {
            if let Ok(value) = std::str::from_utf8(value) {
                if !header.is_empty() {
                    header.push(',');
                }
                header.push_str(value);
            }
        }
        Self { header }
    }

    /// The first content coding of the stored response `headers` that the request does
    /// not accept, if any.
    pub(crate) fn refused<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        headers
            .get_all(header::CONTENT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|coding| !coding.is_empty())
            .find(|coding| !self.accepts(coding))
    }

    /// Whether `coding` is acceptable.
    fn accepts(&self, coding: &str) -> bool {
        let coding = normalized(coding);
        let mut wildcard = None;
        for item in self.header.split(',') {
            let mut parts = item.split(';');
            let name = normalized(parts.next().unwrap_or("").trim());
            let weighted = parts.all(|p| !is_zero_weight(p));
            if name == coding {
                return weighted;
            }
            if name == "*" {
                wildcard = Some(weighted);
            }
        }
        // Not named: `*` decides, else only `identity` is acceptable.
        wildcard.unwrap_or(coding == "identity")
    }
}

/// `x-gzip` is `gzip` (RFC 9110, 8.4.1.3); codings are case-insensitive.
fn normalized(coding: &str) -> String {
    let coding = coding.to_ascii_lowercase();
    match coding.as_str() {
        "x-gzip" => "gzip".to_owned(),
        "x-compress" => "compress".to_owned(),
        _ => coding,
    }
}

/// Whether the parameter `p` is `q=0` (or `q=0.0`, `q=0.000`).
fn is_zero_weight(p: &str) -> bool {
    let Some((name, value)) = p.split_once('=') else {
        return false;
    };
    name.trim().eq_ignore_ascii_case("q")
        && value
            .trim()
            .parse::<f32>()
            .is_ok_and(|weight| weight <= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(accept: &[&str], encoding: &str) -> bool {
        let mut req = http::Request::get("/");
        for value in accept {
            req = req.header("accept-encoding", *value);
        }
        let req = req.body(()).unwrap();
        let mut stored = HeaderMap::new();
        if !encoding.is_empty() {
            stored.insert(header::CONTENT_ENCODING, encoding.parse().unwrap());
        }
        AcceptedCodings::of(&req).refused(&stored).is_some()
    }

    #[test]
    fn a_stored_encoding_must_be_one_the_retry_accepts() {
        assert!(!refused(&[], ""));
        assert!(refused(&[], "gzip"));
        assert!(!refused(&["gzip, br"], "gzip"));
        assert!(!refused(&["br", "GZIP;q=0.5"], "gzip"));
        assert!(!refused(&["x-gzip"], "gzip"));
        assert!(refused(&["br"], "gzip"));
        assert!(refused(&["gzip;q=0"], "gzip"));
        assert!(!refused(&["*"], "gzip"));
        assert!(refused(&["*, gzip;q=0"], "gzip"));
        assert!(refused(&["gzip"], "gzip, br"));
        assert!(!refused(&["identity;q=1"], "identity"));
        assert!(refused(&["identity;q=0"], "identity"));
    }
}
