//! Extractors that can refuse, and the principal-scoped idempotency preset, through the
//! tower layer.

use std::{convert::Infallible, fmt};

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{ServiceExt, service_fn};
use tower_lock::{
    IdempotencyLayer, LockEngine, LockLayer,
    key::{self, ExtractError},
};

#[derive(Clone)]
struct UserId(&'static str);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// POST `/orders` as `user` (if any) with `idempotency-key: k` (if any); the handler
/// reports its lock key.
async fn post(
    layer: &LockLayer,
    user: Option<&'static str>,
    k: Option<&str>,
) -> (StatusCode, String) {
    let service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|req: Request<String>| async move {
            let key = req
                .extensions()
                .get::<tower_lock::LeaseInfo>()
                .map_or(String::new(), |i| i.key().to_string());
            Ok::<_, Infallible>(Response::new(key))
        }));
    let mut req = Request::post("/orders");
    if let Some(k) = k {
        req = req.header("idempotency-key", k);
    }
    let mut req = req.body(String::new()).unwrap();
    if let Some(user) = user {
        // What an authentication middleware outside the lock layer would do.
        req.extensions_mut().insert(UserId(user));
    }
    let res = service.oneshot(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_principal_preset_scopes_keys_by_the_principal_in_the_extensions() {
    let engine = LockEngine::in_memory();
    let layer = IdempotencyLayer::builder(engine.clone())
        .per_principal::<UserId>()
        .without_replay()
        .build()
        .unwrap();
    let (status, alice) = post(&layer, Some("alice"), Some("k")).await;
    assert_eq!(status, StatusCode::OK);
    let (_, bob) = post(&layer, Some("bob"), Some("k")).await;
    assert_ne!(
        alice, bob,
        "two principals with one key take different locks"
    );
    // Alice's key held: Alice's duplicate is 409, Bob's request with the same key runs.
    let held = engine.lock(&alice).acquire().await.unwrap();
    assert_eq!(
        post(&layer, Some("alice"), Some("k")).await.0,
        StatusCode::CONFLICT
    );
    assert_eq!(post(&layer, Some("bob"), Some("k")).await.0, StatusCode::OK);
    held.release().await.unwrap();
    // No principal: the authentication layer is missing or inside, the server's mistake.
    assert_eq!(
        post(&layer, None, Some("k")).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[tokio::test]
async fn a_closure_that_refuses_a_key_is_answered_400_with_its_reason() {
    let layer = IdempotencyLayer::builder(LockEngine::in_memory())
        .without_replay()
        .key(key::from_fn("user-key", |req| {
            let user = req.extensions().and_then(|e| e.get::<UserId>());
            match user {
                None => Ok(None),
                Some(UserId(u)) if u.contains(' ') => {
                    Err(ExtractError::malformed("the user id has a space"))
                }
                Some(UserId(u)) => Ok(Some((*u).to_owned())),
            }
        }))
        .build()
        .unwrap();
    let (status, key) = post(&layer, Some("alice"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(key.contains("/user-key/alice"), "{key}");
    let (status, body) = post(&layer, Some("a b"), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("the user id has a space"), "{body}");
    assert_eq!(post(&layer, None, None).await.0, StatusCode::BAD_REQUEST);
}

/// POST `/orders` to `layer` with `headers`; the handler reports its lock key.
async fn post_with(layer: &LockLayer, headers: &[(&str, &str)]) -> (StatusCode, String) {
    let service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|req: Request<String>| async move {
            let key = req
                .extensions()
                .get::<tower_lock::LeaseInfo>()
                .map_or(String::new(), |i| i.key().to_string());
            Ok::<_, Infallible>(Response::new(key))
        }));
    let mut req = Request::post("/orders");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = service
        .oneshot(req.body(String::new()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// A principal scope with no principal in the request is the server's mistake (the
/// authentication layer is missing, or inside the lock layer): `500`, never a `400` that
/// blames the client.
#[tokio::test]
async fn a_principal_scope_without_a_principal_is_a_server_error() {
    let layer = IdempotencyLayer::builder(LockEngine::in_memory())
        .per_principal::<UserId>()
        .without_replay()
        .build()
        .unwrap();
    let (status, body) = post(&layer, None, Some("k")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(
        body.contains("urn:tower-lock:problem:misconfigured"),
        "{body}"
    );
}

/// A `400` for a missing key names the part that is missing.
#[tokio::test]
async fn a_missing_key_is_named_in_the_detail() {
    let layer = IdempotencyLayer::builder(LockEngine::in_memory())
        .scope_by(key::HeaderKey::new("x-tenant-id"))
        .without_replay()
        .build()
        .unwrap();
    let (status, body) = post_with(&layer, &[("idempotency-key", "k")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("x-tenant-id"),
        "the missing tenant header is named: {body}"
    );
    let (status, body) = post_with(&layer, &[("x-tenant-id", "acme")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("Idempotency-Key"),
        "the missing key header is named: {body}"
    );
}

/// Two layers keyed by closures over different headers never share a lock: each closure
/// has a kind of its own.
#[tokio::test]
async fn closures_over_different_headers_do_not_share_locks() {
    let engine = LockEngine::in_memory();
    let user = LockLayer::builder(engine.clone())
        .key(key::from_fn("x-user", |req| {
            req.header_str("x-user").map(str::to_owned)
        }))
        .build()
        .unwrap();
    let account = LockLayer::builder(engine.clone())
        .key(key::from_fn("x-account", |req| {
            req.header_str("x-account").map(str::to_owned)
        }))
        .build()
        .unwrap();
    let (_, user_key) = post_with(&user, &[("x-user", "42")]).await;
    let held = engine.lock(&user_key).acquire().await.unwrap();
    let (status, body) = post_with(&account, &[("x-account", "42")]).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "x-account: 42 was locked by x-user: 42: {body}"
    );
    held.release().await.unwrap();
}

/// `ScopedKey::new` takes the scope header's name as text (any case), as `HeaderKey::new`
/// does; an invalid name fails `build`, quoting the name.
#[test]
fn scoped_keys_take_their_scope_header_by_text_checked_when_built() {
    use tower_lock::{
        ConfigError,
        key::{IdempotencyKey, KeyExtractor, ScopedKey},
    };
    let scoped = ScopedKey::new("X-Tenant-Id", IdempotencyKey::new());
    assert_eq!(scoped.kind(), "scope(header=x-tenant-id,idempotency-key)");
    let ok = LockLayer::builder(LockEngine::in_memory())
        .key(scoped)
        .build();
    assert!(ok.is_ok(), "{ok:?}");
    let bad = LockLayer::builder(LockEngine::in_memory())
        .key(ScopedKey::new("x tenant", IdempotencyKey::new()))
        .build();
    let Err(ConfigError::Extractor(reason)) = bad else {
        panic!("an invalid scope header name was accepted: {bad:?}");
    };
    assert!(reason.contains("\"x tenant\""), "{reason}");
}

/// `IdempotencyKey::header` takes the header's name as text (any case); an invalid name
/// fails `build`, quoting the name.
#[test]
fn idempotency_key_headers_are_named_by_text_checked_when_built() {
    use tower_lock::{
        ConfigError,
        key::{IdempotencyKey, KeyExtractor},
    };
    let key = IdempotencyKey::header("X-Idempotency-Key");
    assert_eq!(key.kind(), "idempotency-key(x-idempotency-key)");
    assert_eq!(
        IdempotencyKey::header("Idempotency-Key").kind(),
        "idempotency-key"
    );
    let ok = LockLayer::builder(LockEngine::in_memory()).key(key).build();
    assert!(ok.is_ok(), "{ok:?}");
    let bad = LockLayer::builder(LockEngine::in_memory())
        .key(IdempotencyKey::header("x idempotency key"))
        .build();
    let Err(ConfigError::Extractor(reason)) = bad else {
        panic!("an invalid idempotency key header name was accepted: {bad:?}");
    };
    assert!(reason.contains("\"x idempotency key\""), "{reason}");
}
