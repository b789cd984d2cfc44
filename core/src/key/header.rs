//! [`HeaderKey`]: the value of a named header is the key.

use std::borrow::Cow;

use http::HeaderName;

use super::{ExtractError, KeyExtractor, RequestView};

/// The trimmed value of header `name`: `None` when absent, malformed when not UTF-8.
pub(super) fn header_str<'a>(
    req: &'a dyn RequestView,
    name: &HeaderName,
) -> Result<Option<&'a str>, ExtractError> {
    match req.header_named(name) {
        None => Ok(None),
        Some(raw) => std::str::from_utf8(raw)
            .map(|s| Some(s.trim()))
            .map_err(|_| ExtractError::malformed(format!("the {name} header is not valid UTF-8"))),
    }
}

/// A header name given as text: parsed at once, its error kept for
/// [`KeyExtractor::validate`] (so a layer with an invalid name is refused by `build`).
/// Any case: header names are case-insensitive, and `http` keeps them in lower case.
pub(super) fn parse_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a valid HTTP header name"))
}

/// The value of a named header is the key. An absent or empty header means no key.
///
/// Its kind is `header=<name>`: layers keyed on different headers never share a lock.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: Result<HeaderName, String>,
    kind: String,
}

impl HeaderKey {
    /// Lock on the value of the header named `name` (any case): given as text, or as a
    /// `HeaderName` of either `http` version (actix-web 4's is 0.2), so an actix
    /// application needs no second `http` crate. A name that is not a valid header name
    /// makes `LockLayerBuilder::build` fail with
    /// [`ConfigError::Extractor`](crate::ConfigError::Extractor).
    ///
    /// ```
    /// use tower_lock::{ConfigError, LockEngine, LockLayer, http::HeaderName, key::HeaderKey};
    ///
    /// let layer = LockLayer::builder(LockEngine::in_memory()).key(HeaderKey::new("X-Tenant-Id")).build();
    /// assert!(layer.is_ok());
    /// let typed = HeaderKey::new(HeaderName::from_static("x-tenant-id"));
    /// # let _ = typed;
    /// let bad = LockLayer::builder(LockEngine::in_memory()).key(HeaderKey::new("x tenant")).build();
    /// assert!(matches!(bad, Err(ConfigError::Extractor(_))));
    /// ```
    pub fn new(name: impl AsRef<str>) -> Self {
        let name = parse_name(name.as_ref());
        let kind = match &name {
            Ok(name) => format!("header={name}"),
            Err(_) => "header=".to_owned(),
        };
        Self { name, kind }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        Ok(self.extract_ref(req)?.map(Cow::into_owned))
    }

    fn extract_ref<'r>(
        &self,
        req: &'r dyn RequestView,
    ) -> Result<Option<Cow<'r, str>>, ExtractError> {
        let name = self
            .name
            .as_ref()
            .map_err(|e| ExtractError::misconfigured(e.clone()))?;
        match header_str(req, name)? {
            None => Err(ExtractError::missing(format!("the {name} header"))),
            Some("") => Err(ExtractError::missing(format!(
                "a value in the {name} header: it is empty"
            ))),
            Some(value) => Ok(Some(Cow::Borrowed(value))),
        }
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn validate(&self) -> Result<(), String> {
        self.name.as_ref().map(drop).map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_request as req;

    #[test]
    fn header_key_treats_empty_as_missing() {
        let k = HeaderKey::new(HeaderName::from_static("x-k"));
        let empty = k.extract(&req(&[("x-k", " ")])).unwrap_err();
        assert_eq!(empty.kind(), crate::key::ExtractErrorKind::Missing);
        assert!(empty.reason().contains("x-k"), "{empty}");
        assert_eq!(k.extract(&req(&[("x-k", "v")])).unwrap().unwrap(), "v");
    }

    #[test]
    fn a_name_given_as_text_is_lower_cased_or_refused() {
        let k = HeaderKey::new("X-K");
        assert_eq!(k.kind(), "header=x-k");
        assert_eq!(k.validate(), Ok(()));
        assert_eq!(k.extract(&req(&[("x-k", "v")])).unwrap().unwrap(), "v");
        let bad = HeaderKey::new("x k");
        assert!(bad.validate().unwrap_err().contains("\"x k\""));
        assert!(bad.extract(&req(&[])).is_err());
    }
}
