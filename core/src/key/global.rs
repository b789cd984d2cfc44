//! [`GlobalKey`]: one key for every request.

use super::{ExtractError, KeyExtractor, RequestView};

/// One key for every request: the wrapped service runs one request at a time. The kind
/// is `global`.
#[derive(Debug, Clone)]
pub struct GlobalKey {
    key: String,
}

impl GlobalKey {
    /// Lock every request on `key`.
    pub fn new(key: impl Into<String>) -> Self {
        Self { key: key.into() }
    }
}

impl KeyExtractor for GlobalKey {
    fn extract(&self, _req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        Ok(Some(self.key.clone()))
    }

    fn kind(&self) -> &str {
        "global"
    }
}
