//! The [`KeyExtractor`] trait, implemented by every built-in extractor (and by closures
//! through [`from_fn`](super::from_fn)).

use std::{borrow::Cow, sync::Arc};

use super::{ExtractError, RequestView};

/// Derives the lock key of a request.
///
/// [`extract`](Self::extract) gives the request's *value*: `Ok(Some(value))` locks it;
/// `Ok(None)` means the request has no key (the layer's missing-key policy decides: pass
/// through unlocked, or `400`), as does [`ExtractError::missing`], which also names what is
/// missing; [`ExtractError::malformed`] is the client's malformed key (`400`), and
/// [`ExtractError::misconfigured`] the server's own mistake (`500`, logged). The
/// layer then names the lock `<namespace>/<kind>/<value>` (see [the module
/// docs](crate::key#the-lock-key)) and validates it as a [`LockKey`](crate::engine::LockKey) (at most
/// 512 bytes, no control characters); a key that fails is also answered `400`.
///
/// The value needs no prefix or kind word of its own: the layer adds the extractor's
/// [`kind`](Self::kind), so two extractors of different kinds never share a lock.
///
/// A closure becomes an extractor with [`from_fn`](super::from_fn), which names its kind:
/// there is no default kind, so two extractors can only share locks by saying so.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The value of `req` to lock on.
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError>;

    /// [`extract`](Self::extract), borrowing the value from `req` when it is there as is
    /// (a header's value, the path): the layer copies it straight into the lock key, so
    /// the request costs no `String` of its own. Must give the same value as `extract`.
    /// The default calls `extract`; override it only to save that allocation.
    fn extract_ref<'r>(
        &self,
        req: &'r dyn RequestView,
    ) -> Result<Option<Cow<'r, str>>, ExtractError> {
        Ok(self.extract(req)?.map(Cow::Owned))
    }

    /// What the value is: part of every lock key, so that the same value read by
    /// extractors of different kinds (a tenant header, an idempotency key, a path) names
    /// different locks. Extractors of one kind in layers of one namespace share their
    /// locks.
    ///
    /// The built-in extractors each have a fixed kind (`header=<name>`,
    /// `idempotency-key`, `scope(<scope kind>,<inner kind>)`, `principal`, `path`,
    /// `method-path`, `global`; see [the key kinds](crate::key#key-kinds)); a closure's is the one given to [`from_fn`](super::from_fn). There is
    /// no default: an extractor type that could silently share its locks with every other
    /// type that forgot to name itself would be a trap. The layer reads it once, when it
    /// is built.
    fn kind(&self) -> &str;

    /// Whether the extractor's own configuration is usable, checked once by
    /// `LockLayerBuilder::build`: `Err(reason)` refuses
    /// the layer with [`ConfigError::Extractor`](crate::ConfigError::Extractor). For
    /// extractors configured from text, such as [`HeaderKey::new`](super::HeaderKey::new);
    /// wrappers forward their inner extractor's. The default accepts.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A shared extractor is an extractor: the idempotency preset keeps its scope and its key
/// as `Arc<dyn KeyExtractor>` and scopes one by the other with the same
/// [`ScopedKey`](super::ScopedKey) as everyone else.
impl<T: KeyExtractor + ?Sized> KeyExtractor for Arc<T> {
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        (**self).extract(req)
    }

    fn extract_ref<'r>(
        &self,
        req: &'r dyn RequestView,
    ) -> Result<Option<Cow<'r, str>>, ExtractError> {
        (**self).extract_ref(req)
    }

    fn kind(&self) -> &str {
        (**self).kind()
    }

    fn validate(&self) -> Result<(), String> {
        (**self).validate()
    }
}
