//! [`Principal`]: the authenticated principal an earlier middleware put in the request
//! extensions, a plain extractor (scope any key by it with [`ScopedKey::by`](super::ScopedKey::by)).

use std::{any::type_name, fmt, marker::PhantomData};

use super::{ExtractError, KeyExtractor, RequestView, kind};

/// The principal of type `P` found in the request extensions (its `Display`), put there by
/// an authentication middleware that runs before the lock layer. Usually a scope:
/// `ScopedKey::by(Principal::<User>::new(), IdempotencyKey::new())`, or the idempotency
/// preset's `per_principal::<User>()`, which builds just that.
///
/// A request without a `P`, or with one whose `Display` is empty, is the server's mistake
/// (the authentication layer is missing, runs inside this one, or lets anonymous
/// requests through): it is answered `500` with the `misconfigured` problem type and one
/// throttled `error!` log naming the fix, never a `400` that blames the client.
///
/// Its kind is `principal`, not the type's name: a key must not change when the type
/// moves to another module (a fleet in a rolling deploy would take two keys for one
/// request). The kind is reserved: it tells a framework whose requests carry no `http`
/// extensions (actix-web) to refuse the key when its middleware is made.
///
/// ```
/// use tower_lock::key::{IdempotencyKey, KeyExtractor, Principal, ScopedKey};
///
/// #[derive(Clone)]
/// struct User(String);
/// impl std::fmt::Display for User {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str(&self.0)
///     }
/// }
///
/// let per_user = ScopedKey::by(Principal::<User>::new(), IdempotencyKey::new());
/// let mut req = http::Request::post("/orders").header("idempotency-key", "\"o-1\"").body(()).unwrap();
/// assert!(per_user.extract(&req).is_err(), "no user: the server's mistake");
/// req.extensions_mut().insert(User("alice".into()));
/// assert_eq!(per_user.extract(&req).unwrap().as_deref(), Some("alice/o-1"));
/// assert_eq!(per_user.kind(), "scope(principal,idempotency-key)");
/// ```
pub struct Principal<P>(PhantomData<fn() -> P>);

impl<P> Principal<P> {
    /// The principal of type `P` in the request extensions.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<P> Default for Principal<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> Clone for Principal<P> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<P> fmt::Debug for Principal<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Principal").field(&type_name::<P>()).finish()
    }
}

impl<P> KeyExtractor for Principal<P>
where
    P: fmt::Display + Send + Sync + 'static,
{
    fn extract(&self, req: &dyn RequestView) -> Result<Option<String>, ExtractError> {
        // No principal is the server's mistake: blaming the client with a 400 would send
        // the alert to the wrong team.
        let Some(principal) = req.extensions().and_then(|e| e.get::<P>()) else {
            return Err(principal_missing::<P>(req));
        };
        let principal = principal.to_string();
        if principal.is_empty() {
            return Err(ExtractError::misconfigured(format!(
                "the request's {} is empty: the authentication layer must give every principal a non-empty Display",
                type_name::<P>()
            )));
        }
        Ok(Some(principal))
    }

    fn kind(&self) -> &str {
        kind::PRINCIPAL
    }
}

/// The error of a principal that is not in the request.
fn principal_missing<P>(req: &dyn RequestView) -> ExtractError {
    let principal = type_name::<P>();
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
    use crate::key::{ExtractErrorKind, IdempotencyKey, ScopedKey, test_request as req};

    #[derive(Clone)]
    struct User(&'static str);

    impl fmt::Display for User {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    #[test]
    fn principals_scope_the_inner_key_and_a_missing_principal_is_a_server_mistake() {
        let k = ScopedKey::by(Principal::<User>::new(), IdempotencyKey::new());
        let with = |user| {
            let mut r = req(&[("idempotency-key", "k")]);
            r.extensions_mut().insert(User(user));
            k.extract(&r)
        };
        assert_ne!(with("a/b").unwrap(), with("a").unwrap());
        assert_eq!(with("alice").unwrap().as_deref(), Some("alice/k"));
        let none = k.extract(&req(&[("idempotency-key", "k")])).unwrap_err();
        assert_eq!(none.kind(), ExtractErrorKind::Misconfigured);
        assert_eq!(
            with("").unwrap_err().kind(),
            ExtractErrorKind::Misconfigured
        );
        assert_eq!(k.kind(), "scope(principal,idempotency-key)");
    }
}
