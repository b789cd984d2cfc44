//! [`ExtractError`]: why an extractor gave no key, and whose mistake that is.

use std::{borrow::Cow, error::Error as StdError, fmt};

/// Why a [`KeyExtractor`](super::KeyExtractor) gave no key for a request, and whose
/// mistake that is: the client's (`400 Bad Request`) or the server's (`500 Internal Server
/// Error`, with one throttled `error!` log naming the route and the cause, so that the
/// alert goes to the team that can fix it).
///
/// - [`missing`](Self::missing): the request lacks a part the key is made of (a header, a
///   value). The layer's missing-key policy decides: pass through unlocked, or `400`
///   naming the part.
/// - [`malformed`](Self::malformed): the part is there but unusable: `400` with the
///   reason as the problem's `detail`.
/// - [`misconfigured`](Self::misconfigured): the server cannot derive the key because of
///   its own setup (a route parameter the route does not have, a principal no
///   authentication layer put in the request): `500`. The reason goes to the log, not to
///   the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractError {
    kind: ExtractErrorKind,
    reason: Cow<'static, str>,
}

/// Whose mistake an [`ExtractError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExtractErrorKind {
    /// The request lacks a part of its key (the client's; subject to the missing-key
    /// policy).
    Missing,
    /// The request's key is malformed (the client's: `400`).
    Malformed,
    /// The server's setup cannot give this request a key (`500`).
    Misconfigured,
}

impl ExtractError {
    /// The request lacks `what` (for example "the `x-tenant-id` header"), which the key is
    /// made of.
    pub fn missing(what: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ExtractErrorKind::Missing, what)
    }

    /// A malformed key, with a reason a client can act on.
    pub fn malformed(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ExtractErrorKind::Malformed, reason)
    }

    /// The server's setup cannot derive this request's key, with a reason for the
    /// operator's log.
    pub fn misconfigured(reason: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ExtractErrorKind::Misconfigured, reason)
    }

    fn new(kind: ExtractErrorKind, reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            kind,
            reason: reason.into(),
        }
    }

    /// Whose mistake it is.
    pub fn kind(&self) -> ExtractErrorKind {
        self.kind
    }

    /// What is missing, why the key was refused, or what is misconfigured.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ExtractErrorKind::Missing => write!(f, "missing {}", self.reason),
            ExtractErrorKind::Malformed | ExtractErrorKind::Misconfigured => {
                f.write_str(&self.reason)
            }
        }
    }
}

impl StdError for ExtractError {}
