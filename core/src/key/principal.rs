//! [`PrincipalScopedKey`]: another extractor's key, scoped by the authenticated principal
//! an earlier middleware put in the request extensions.

use std::{any::type_name, fmt, marker::PhantomData};

use super::{ExtractError, KeyExtractor, RequestView, encoding::scoped};

/// Another extractor's key, scoped by the principal of type `P` found in the request
/// extensions (put there by an authentication middleware that runs before the lock
/// layer): two principals sending the same inner key lock different keys. A request
/// without a `P` is the server's mistake (the authentication layer is missing or runs
/// inside this one): it is answered `500` with the `misconfigured` problem type and one
/// throttled `error!` log, as under
/// `IdempotencyLayerBuilder::per_principal`.
///
/// The value is `<principal>/<inner value>`, the principal (its `Display`) escaped as in
/// the [lock key](crate::key#the-lock-key), or written as its SHA-256 when it is long;
/// the kind is `principal(<type of P>,<inner kind>)`. Framework integrations without
/// `http` extensions (actix) find no principal.
pub struct PrincipalScopedKey<P, K> {
    inner: K,
    kind: String,
    _principal: PhantomData<fn() -> P>,
}

impl<P, K: KeyExtractor> PrincipalScopedKey<P, K> {
    /// Scope `inner` by the `P` in the request extensions.
    pub fn new(inner: K) -> Self {
        let kind = format!("principal({},{})", type_name::<P>(), inner.kind());
        Self {
            inner,
            kind,
            _principal: PhantomData,
        }
    }
}

impl<P, K: fmt::Debug> fmt::Debug for PrincipalScopedKey<P, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrincipalScopedKey")
            .field("principal", &type_name::<P>())
            .field("inner", &self.inner)
            .finish()
    }
}

impl<P, K> KeyExtractor for PrincipalScopedKey<P, K>
where
    P: fmt::Display + Send + Sync + 'static,
    K: KeyExtractor,
{
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        let Some(principal) = req.extensions().and_then(|e| e.get::<P>()) else {
            // The server's mistake: see `Principal` in the replay scope.
            return Err(principal_missing::<P>(req));
        };
        let principal = principal.to_string();
        if principal.is_empty() {
            return Err(ExtractError::missing(format!(
                "a principal: the request's {} is empty",
                type_name::<P>()
            )));
        }
        let Some(inner) = self.inner.extract_ref(req)? else {
            return Ok(None);
        };
        Ok(Some(scoped(&principal, &inner)))
    }

    fn kind(&self) -> &str {
        &self.kind
    }

    fn validate(&self) -> Result<(), String> {
        self.inner.validate()
    }

    fn needs_extensions(&self) -> bool {
        true
    }
}

/// The error of a principal scope that finds no principal of type `P` in the request.
pub(crate) fn principal_missing<P>(req: &dyn RequestView) -> ExtractError {
    let principal = std::any::type_name::<P>();
    if req.extensions().is_none() {
        ExtractError::misconfigured(format!(
            "no principal: this framework's requests carry no http extensions, so no {principal} can be found (scope with scope_by instead)"
        ))
    } else {
        ExtractError::misconfigured(format!(
            "no {principal} in the request extensions: the authentication layer must run before (outside) this layer and turn away unauthenticated requests"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{IdempotencyKey, test_request as req};

    #[derive(Clone)]
    struct User(&'static str);

    impl fmt::Display for User {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    #[test]
    fn principals_scope_the_inner_key_and_a_missing_principal_is_a_server_mistake() {
        let k = PrincipalScopedKey::<User, _>::new(IdempotencyKey::new());
        let with = |user| {
            let mut r = req(&[("idempotency-key", "k")]);
            r.extensions_mut().insert(User(user));
            k.extract(&r).unwrap()
        };
        assert_ne!(with("a/b"), with("a"));
        assert_eq!(with("alice").as_deref(), Some("alice/k"));
        let none = k.extract(&req(&[("idempotency-key", "k")])).unwrap_err();
        assert_eq!(none.kind(), crate::key::ExtractErrorKind::Misconfigured);
        assert!(k.kind().starts_with("principal(") && k.kind().ends_with(",idempotency-key)"));
    }

    #[test]
    fn principal_keys_need_the_extensions_and_wrappers_say_so() {
        let principal = || PrincipalScopedKey::<User, _>::new(IdempotencyKey::new());
        assert!(principal().needs_extensions());
        assert!(crate::key::ScopedKey::new("x-tenant", principal()).needs_extensions());
        assert!(!crate::key::ScopedKey::new("x-tenant", IdempotencyKey::new()).needs_extensions());
        assert!(!IdempotencyKey::new().needs_extensions());
    }
}
