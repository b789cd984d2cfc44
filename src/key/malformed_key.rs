//! [`MalformedKey`]: a key that is present but unusable.

use std::{borrow::Cow, error::Error as StdError, fmt};

/// A key that is present but unusable; the request is answered `400 Bad Request` with
/// the reason as the problem's `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedKey {
    reason: Cow<'static, str>,
}

impl MalformedKey {
    /// A malformed key, with a reason a client can act on.
    pub fn new(reason: impl Into<Cow<'static, str>>) -> Self {
        MalformedKey {
            reason: reason.into(),
        }
    }

    /// Why the key was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for MalformedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl StdError for MalformedKey {}
