//! [`HeaderKey`]: the value of a named header is the key.

use http::HeaderName;

use super::{KeyExtractor, MalformedKey, RequestView};

/// The trimmed value of header `name`: `None` when absent, malformed when not UTF-8.
pub(super) fn header_str<'a>(
    req: &'a dyn RequestView,
    name: &HeaderName,
) -> Result<Option<&'a str>, MalformedKey> {
    match req.header(name.as_str()) {
        None => Ok(None),
        Some(raw) => std::str::from_utf8(raw)
            .map(|s| Some(s.trim()))
            .map_err(|_| MalformedKey::new(format!("the {name} header is not valid UTF-8"))),
    }
}

/// The value of a named header is the key. An absent or empty header means no key.
///
/// Its kind is `header=<name>`: layers keyed on different headers never share a lock.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
    kind: String,
}

impl HeaderKey {
    /// Lock on the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        let kind = format!("header={name}");
        HeaderKey { name, kind }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        Ok(header_str(req, &self.name)?
            .filter(|v| !v.is_empty())
            .map(str::to_owned))
    }

    fn kind(&self) -> &str {
        &self.kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_request as req;

    #[test]
    fn header_key_treats_empty_as_missing() {
        let k = HeaderKey::new(HeaderName::from_static("x-k"));
        assert_eq!(k.extract(&req(&[("x-k", " ")])).unwrap(), None);
        assert_eq!(k.extract(&req(&[("x-k", "v")])).unwrap().unwrap(), "v");
    }
}
