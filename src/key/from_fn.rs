//! [`from_fn`]: an extractor from a closure that may refuse a malformed key.

use std::fmt;

use super::{KeyExtractor, MalformedKey, RequestView};

/// An extractor from a closure that returns `Ok(Some(value))`, `Ok(None)` (no key) or
/// `Err(MalformedKey)` (`400` with the reason as the problem's `detail`), under a `kind` of
/// its own (see [`KeyExtractor::kind`]): two closures with different kinds never share a
/// lock, even in layers of one namespace.
///
/// A closure that cannot refuse is an extractor as it is (kind `custom`); `from_fn` is for
/// one that validates, for example a key scoped by the authenticated principal:
///
/// ```
/// use tower_lock::key::{self, IdempotencyKey, KeyExtractor, MalformedKey, RequestView};
///
/// #[derive(Clone)]
/// struct UserId(String);
///
/// let per_user = key::from_fn("user-idempotency", |req: &dyn RequestView| {
///     let Some(user) = req.extensions().and_then(|e| e.get::<UserId>()) else {
///         return Ok(None); // not signed in: no key (400 under the idempotency preset)
///     };
///     if user.0.contains('/') {
///         return Err(MalformedKey::new("the user id has a '/'"));
///     }
///     let key = IdempotencyKey::new().extract(req)?;
///     Ok(key.map(|k| format!("{}/{k}", user.0)))
/// });
/// assert_eq!(per_user.kind(), "user-idempotency");
/// ```
pub fn from_fn<F>(kind: impl Into<String>, f: F) -> FnKey<F>
where
    F: Fn(&dyn RequestView) -> Result<Option<String>, MalformedKey> + Send + Sync + 'static,
{
    FnKey {
        kind: kind.into(),
        f,
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

impl<F> KeyExtractor for FnKey<F>
where
    F: Fn(&dyn RequestView) -> Result<Option<String>, MalformedKey> + Send + Sync + 'static,
{
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, MalformedKey> {
        (self.f)(req)
    }

    fn kind(&self) -> &str {
        &self.kind
    }
}
