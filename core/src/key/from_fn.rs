//! [`from_fn`]: an extractor from a closure, under a kind of its own.

use std::fmt;

use super::{ExtractError, KeyExtractor, RequestView};

/// An extractor from a closure, under a `kind` of its own (see [`KeyExtractor::kind`]):
/// two closures with different kinds never share a lock, even in layers of one namespace.
///
/// The closure gets the request as `&dyn RequestView` (its type is inferred, and its
/// methods need no import) and returns the value to lock on: `Option<String>` (`None`: the
/// request has no key), or `Result<Option<String>, ExtractError>` for one that can refuse
/// a malformed key (`400` with the reason as the problem's `detail`) or report the
/// server's own mistake (`500`).
///
/// ```
/// use tower_lock::key::{self, ExtractError, IdempotencyKey, KeyExtractor};
///
/// // One lock per user, from a header.
/// let per_user = key::from_fn("x-user", |req| req.header_str("x-user").map(str::to_owned));
/// assert_eq!(per_user.kind(), "x-user");
///
/// #[derive(Clone)]
/// struct UserId(String);
///
/// // A key scoped by the authenticated principal, refusing what it cannot use.
/// let per_account = key::from_fn("user-idempotency", |req| {
///     let Some(user) = req.extensions().and_then(|e| e.get::<UserId>()) else {
///         // The authentication layer must run first: the server's mistake (500).
///         return Err(ExtractError::misconfigured("no UserId in the request"));
///     };
///     if user.0.contains('/') {
///         return Err(ExtractError::malformed("the user id has a '/'"));
///     }
///     let key = IdempotencyKey::new().extract(req)?;
///     Ok(key.map(|k| format!("{}/{k}", user.0)))
/// });
/// assert_eq!(per_account.kind(), "user-idempotency");
/// ```
pub fn from_fn<F, R>(kind: impl Into<String>, f: F) -> FnKey<F>
where
    F: Fn(&dyn RequestView) -> R + Send + Sync + 'static,
    R: Into<Extracted>,
{
    FnKey {
        kind: kind.into(),
        f,
    }
}

/// What a [`from_fn`] closure returns: `Option<String>`, or `Result<Option<String>,
/// ExtractError>`.
#[derive(Debug)]
pub struct Extracted(Result<Option<String>, ExtractError>);

impl From<Option<String>> for Extracted {
    fn from(value: Option<String>) -> Self {
        Self(Ok(value))
    }
}

impl From<Result<Option<String>, ExtractError>> for Extracted {
    fn from(result: Result<Option<String>, ExtractError>) -> Self {
        Self(result)
    }
}

/// The extractor [`from_fn`] makes.
#[derive(Clone)]
pub struct FnKey<F> {
    kind: String,
    f: F,
}

impl<F> fmt::Debug for FnKey<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnKey")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl<F, R> KeyExtractor for FnKey<F>
where
    F: Fn(&dyn RequestView) -> R + Send + Sync + 'static,
    R: Into<Extracted>,
{
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        (self.f)(req).into().0
    }

    fn kind(&self) -> &str {
        &self.kind
    }
}
