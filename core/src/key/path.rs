//! [`PathKey`] and [`MethodPathKey`]: the request path (and method) is the key.

use std::borrow::Cow;

use super::{ExtractError, KeyExtractor, RequestView};

/// The request path is the key: one request at a time per URL path. The kind is `path`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PathKey;

impl KeyExtractor for PathKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        Ok(Some(req.path().to_owned()))
    }

    fn extract_ref<'r>(
        &self,
        req: &'r dyn RequestView,
    ) -> Result<Option<Cow<'r, str>>, ExtractError> {
        Ok(Some(Cow::Borrowed(req.path())))
    }

    fn kind(&self) -> &str {
        "path"
    }
}

/// Method and path are the key: `POST /jobs` and `GET /jobs` lock separately. The value
/// is `<method> <path>` (a method has no space); the kind is `method-path`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodPathKey;

impl KeyExtractor for MethodPathKey {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        Ok(Some(format!("{} {}", req.method(), req.path())))
    }

    fn kind(&self) -> &str {
        "method-path"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_request as req;

    #[test]
    fn path_and_method_keys_ignore_the_query() {
        assert_eq!(PathKey.extract(&req(&[])).unwrap().unwrap(), "/a/b");
        assert_eq!(
            MethodPathKey.extract(&req(&[])).unwrap().unwrap(),
            "POST /a/b"
        );
    }
}
