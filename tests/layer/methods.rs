//! The method filter: only the configured methods take a lock; the others pass through
//! unlocked, without a key being asked of them.

use std::convert::Infallible;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{ServiceExt, service_fn};
use tower_lock::{
    ConfigError, IdempotencyLayer, LockEngine, LockLayer, LockLayerBuilder, key::PathKey,
};

/// Sends one request; the handler answers whether it ran holding a lease.
async fn status_of(
    layer: &LockLayer,
    method: Method,
    idempotency_key: Option<&str>,
) -> (StatusCode, String) {
    let service = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|req: Request<String>| async move {
            let locked = req.extensions().get::<tower_lock::LeaseInfo>().is_some();
            Ok::<_, Infallible>(Response::new(
                if locked { "locked" } else { "unlocked" }.to_owned(),
            ))
        }));
    let mut req = Request::builder().method(method).uri("/orders");
    if let Some(k) = idempotency_key {
        req = req.header("idempotency-key", k);
    }
    let res = service
        .oneshot(req.body(String::new()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_idempotency_preset_locks_post_and_patch_and_lets_other_methods_pass() {
    let layer = IdempotencyLayer::builder(LockEngine::in_memory())
        .without_replay()
        .build()
        .unwrap();
    // A keyless GET, PUT, DELETE, HEAD or OPTIONS is not asked for a key.
    for method in [
        Method::GET,
        Method::PUT,
        Method::DELETE,
        Method::HEAD,
        Method::OPTIONS,
    ] {
        let (status, body) = status_of(&layer, method.clone(), None).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "unlocked"),
            "{method}"
        );
    }
    // POST and PATCH need one.
    for method in [Method::POST, Method::PATCH] {
        let (status, _) = status_of(&layer, method.clone(), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method}");
        let (status, body) = status_of(&layer, method.clone(), Some("\"k\"")).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "locked"),
            "{method}"
        );
    }
    assert_eq!(layer.metrics().snapshot().acquired, 2);
}

#[tokio::test]
async fn a_method_list_locks_only_those_methods() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(PathKey)
        .methods([Method::PUT])
        .build()
        .unwrap();
    let key = layer.locker().key_for("/orders").unwrap();
    let held = engine.lock_on(key).acquire().await.unwrap();
    // PUT meets the held key; GET does not take a lock at all.
    assert_eq!(
        status_of(&layer, Method::PUT, None).await.0,
        StatusCode::LOCKED
    );
    assert_eq!(status_of(&layer, Method::GET, None).await.0, StatusCode::OK);
    held.release().await.unwrap();
    assert_eq!(status_of(&layer, Method::PUT, None).await.0, StatusCode::OK);
}

#[test]
fn an_empty_method_list_is_refused_at_build_time() {
    let builder: LockLayerBuilder = LockLayer::builder(LockEngine::in_memory()).key(PathKey);
    let err = builder.methods(Vec::<&str>::new()).build().unwrap_err();
    assert_eq!(err, ConfigError::NoMethods);
}

/// RFC 9110 §9.2.1: a CORS preflight (`OPTIONS`), a status `GET`, a `HEAD` or a `TRACE`
/// changes nothing, so by default it passes unlocked; every other method, extension
/// methods included, takes the lock.
#[tokio::test]
async fn by_default_safe_methods_pass_unlocked_and_the_others_are_locked() {
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(PathKey)
        .build()
        .unwrap();
    for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
        let (status, body) = status_of(&layer, method.clone(), None).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "unlocked"),
            "{method}"
        );
    }
    let purge = Method::from_bytes(b"PURGE").unwrap();
    for method in [
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        purge,
    ] {
        let (status, body) = status_of(&layer, method.clone(), None).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "locked"),
            "{method}"
        );
    }
}

/// Methods are named by text or by an `http` type (any version: actix-web's too), and a
/// method list locks exactly what it names, safe methods included.
#[tokio::test]
async fn methods_are_named_by_text_or_by_type() {
    let by_text = LockLayer::builder(LockEngine::in_memory())
        .key(PathKey)
        .methods(["POST", "GET"])
        .build()
        .unwrap();
    for (method, expected) in [
        (Method::POST, "locked"),
        (Method::GET, "locked"),
        (Method::PUT, "unlocked"),
    ] {
        assert_eq!(
            status_of(&by_text, method.clone(), None).await.1,
            expected,
            "{method}"
        );
    }
    let by_type = LockLayer::builder(LockEngine::in_memory())
        .key(PathKey)
        .methods([Method::DELETE])
        .build()
        .unwrap();
    assert_eq!(status_of(&by_type, Method::DELETE, None).await.1, "locked");
    assert_eq!(status_of(&by_type, Method::POST, None).await.1, "unlocked");
    let by_string = LockLayer::builder(LockEngine::in_memory())
        .key(PathKey)
        .methods(vec![String::from("PURGE")])
        .build()
        .unwrap();
    let purge = Method::from_bytes(b"PURGE").unwrap();
    assert_eq!(status_of(&by_string, purge, None).await.1, "locked");
}

/// An invalid method name is a typed error from `build`, not a panic; so is a standard
/// method in the wrong case (methods are case-sensitive: `post` would lock nothing).
#[test]
fn an_invalid_method_name_is_refused_at_build_time() {
    for name in ["PO ST", "", "post"] {
        let err = LockLayer::builder(LockEngine::in_memory())
            .key(PathKey)
            .methods(["PUT", name])
            .build()
            .unwrap_err();
        assert_eq!(err, ConfigError::InvalidMethod(name.to_owned()), "{name:?}");
    }
    let err = ConfigError::InvalidMethod("post".to_owned());
    assert!(err.to_string().contains("\"POST\""), "{err}");
}

/// A lock installed around axum's wrong-method answer (`Router::route_layer` over a
/// `post`-only route: the install the docs advised before) takes the key for a `PUT` that
/// the route then answers `405`: the layer cannot tell it beforehand, so it says so once,
/// naming the install that keeps a `405` outside the lock.
#[tokio::test]
async fn a_lock_around_a_routes_own_405_says_so_once() {
    use axum::{Router, body::Body, routing::post};

    use tracing_subscriber::layer::SubscriberExt;

    use super::log_capture::Capture;

    let capture = Capture::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(tower_lock::key::HeaderKey::new("x-tenant-id"))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/jobs", post(|| async { "ok" }))
        .route_layer(layer);
    for _ in 0..3 {
        let put = Request::put("/jobs")
            .header("x-tenant-id", "acme")
            .body(Body::empty())
            .unwrap();
        let answered = app.clone().oneshot(put).await.unwrap();
        assert_eq!(answered.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    let post = Request::post("/jobs")
        .header("x-tenant-id", "acme")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.oneshot(post).await.unwrap().status(), StatusCode::OK);
    let warned: Vec<_> = capture
        .take()
        .into_iter()
        .filter(|e| e.level == tracing::Level::WARN && e.message().contains("405"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(
        warned[0].message().contains("method_not_allowed_fallback"),
        "{warned:#?}"
    );
    assert!(warned[0].fields["key"].contains("acme"), "{warned:#?}");
}
