//! Deriving a lock key from a request: the [`KeyExtractor`] trait, the built-in
//! extractors, and their combinators: [`ScopedKey`] (any extractor's value scoping any
//! key, a [`Principal`] among them) and [`RouteKey`] (a framework's matched route and the
//! chosen path parameters, behind its [`RouteMatcher`]).
//!
//! Extractors see a request through [`RequestView`]: method, path, headers, and (for
//! `http` 1 requests) the extensions. That keeps them framework-neutral: the tower layer
//! hands them an [`http::Request`], and an integration for a framework with other request
//! types implements [`RequestView`] for its own request.
//!
//! ```
//! use tower_lock::key::{self, HeaderKey, IdempotencyKey, KeyExtractor, ScopedKey};
//!
//! // One lock per tenant.
//! let per_tenant = HeaderKey::new("x-tenant-id");
//! // One lock per idempotency key, within a tenant.
//! let idempotent = ScopedKey::new("x-tenant-id", IdempotencyKey::new());
//! // Anything else: a closure, under a kind of its own.
//! let per_account = key::from_fn("account", |req| {
//!     req.path().strip_prefix("/accounts/").map(|rest| rest.split('/').next().unwrap_or("").to_owned())
//! });
//!
//! let req = http::Request::builder()
//!     .uri("/accounts/7/transfers")
//!     .header("x-tenant-id", "acme")
//!     .header("idempotency-key", "\"8e03978e\"")
//!     .body(())
//!     .unwrap();
//! assert_eq!(per_tenant.kind(), "header=x-tenant-id");
//! assert_eq!(per_tenant.extract(&req).unwrap().as_deref(), Some("acme"));
//! assert_eq!(idempotent.kind(), "scope(header=x-tenant-id,idempotency-key)");
//! assert_eq!(idempotent.extract(&req).unwrap().as_deref(), Some("acme/8e03978e"));
//! assert_eq!(per_account.kind(), "account");
//! assert_eq!(per_account.extract(&req).unwrap().as_deref(), Some("7"));
//! ```
//!
#![doc = include_str!("../docs/lock_key.md")]

mod authority;
pub(crate) mod encoding;
mod extract_error;
mod extractor;
mod from_fn;
mod global;
mod header;
mod idempotency;
pub(crate) mod kind;
mod path;
mod principal;
mod request_view;
mod route;
mod route_key;
mod route_matcher;
mod scoped;

pub use authority::AuthorityKey;
pub use encoding::encode;
pub(crate) use encoding::key_head;
pub use extract_error::{ExtractError, ExtractErrorKind};
pub use extractor::KeyExtractor;
pub use from_fn::{Extracted, FnKey, from_fn};
pub use global::GlobalKey;
pub use header::HeaderKey;
pub use idempotency::{IdempotencyKey, MAX_IDEMPOTENCY_KEY_LEN};
pub use path::{MethodPathKey, PathKey};
pub use principal::Principal;
pub use request_view::{HeaderValues, RequestView};
pub use route_key::RouteKey;
pub use route_matcher::RouteMatcher;
pub use scoped::ScopedKey;

/// A `POST /a/b?q=1` with `headers`, for the extractors' unit tests.
#[cfg(test)]
pub(crate) fn test_request(headers: &[(&str, &str)]) -> http::Request<()> {
    let mut b = http::Request::builder().method("POST").uri("/a/b?q=1");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_extractor_has_a_kind_of_its_own() {
        let header = HeaderKey::new("x-tenant");
        let idempotency = IdempotencyKey::new();
        let scoped = ScopedKey::new("x-tenant", IdempotencyKey::new());
        let scoped_header = ScopedKey::new("x-tenant", HeaderKey::new("x-k"));
        let global = GlobalKey::new("g");
        let closure = from_fn("account", |_| None);
        let kinds = [
            header.kind(),
            idempotency.kind(),
            scoped.kind(),
            scoped_header.kind(),
            PathKey.kind(),
            MethodPathKey.kind(),
            global.kind(),
            closure.kind(),
        ];
        assert_eq!(
            kinds,
            [
                "header=x-tenant",
                "idempotency-key",
                "scope(header=x-tenant,idempotency-key)",
                "scope(header=x-tenant,header=x-k)",
                "path",
                "method-path",
                "global",
                "account",
            ]
        );
    }
}
