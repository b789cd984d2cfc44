//! [`AuthorityKey`]: the authority the request was addressed to (host and port) is the
//! key, whatever the protocol.

use std::borrow::Cow;

use super::{ExtractError, KeyExtractor, RequestView};

/// The authority the client addressed (host name and port, as sent) is the key: the URI's
/// authority when the request has one (HTTP/2's `:authority`, which replaces the `Host`
/// header, and an absolute-form HTTP/1.1 target), else the `Host` header. Host names are
/// case-insensitive, so the key is lower-cased. No authority means no key.
///
/// Its kind is `authority`. Scope an idempotency layer in front of several hosts with it
/// (`scope_by(AuthorityKey::new())`), not with `HeaderKey::new("host")`: an HTTP/2 request
/// (every gRPC call, a browser over h2) carries no `Host` header, and a `host` header key
/// would refuse it for a missing key.
///
/// ```
/// use tower_lock::key::{AuthorityKey, KeyExtractor};
///
/// let h2 = http::Request::get("https://A.example:8443/orders").body(()).unwrap();
/// assert_eq!(AuthorityKey::new().extract(&h2).unwrap().as_deref(), Some("a.example:8443"));
/// let h1 = http::Request::get("/orders").header("host", "b.example").body(()).unwrap();
/// assert_eq!(AuthorityKey::new().extract(&h1).unwrap().as_deref(), Some("b.example"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct AuthorityKey;

impl AuthorityKey {
    /// Lock on (or scope by) the request's authority.
    pub fn new() -> Self {
        Self
    }
}

impl KeyExtractor for AuthorityKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        Ok(self.extract_ref(req)?.map(Cow::into_owned))
    }

    fn extract_ref<'r>(
        &self,
        req: &'r dyn RequestView,
    ) -> Result<Option<Cow<'r, str>>, ExtractError> {
        let raw = req.authority().ok_or_else(|| {
            ExtractError::missing("an authority (the URI's, or a Host header)".to_owned())
        })?;
        let authority = std::str::from_utf8(raw)
            .map_err(|_| ExtractError::malformed("the authority is not valid UTF-8".to_owned()))?
            .trim();
        if authority.is_empty() {
            return Err(ExtractError::missing(
                "an authority: the Host header is empty".to_owned(),
            ));
        }
        Ok(Some(if authority.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(authority.to_ascii_lowercase())
        } else {
            Cow::Borrowed(authority)
        }))
    }

    fn kind(&self) -> &str {
        "authority"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_request as req;

    #[test]
    fn the_host_header_serves_when_the_uri_has_no_authority() {
        let k = AuthorityKey::new();
        assert_eq!(
            k.extract(&req(&[("host", "Shop.Example")]))
                .unwrap()
                .unwrap(),
            "shop.example"
        );
        let missing = k.extract(&req(&[])).unwrap_err();
        assert_eq!(missing.kind(), crate::key::ExtractErrorKind::Missing);
        let empty = k.extract(&req(&[("host", " ")])).unwrap_err();
        assert_eq!(empty.kind(), crate::key::ExtractErrorKind::Missing);
    }
}
