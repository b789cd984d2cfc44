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
    let key = layer.locker().lock_key("/orders").unwrap();
    let held = engine.lock_key(key).acquire().await.unwrap();
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
    let err = builder.methods([]).build().unwrap_err();
    assert_eq!(err, ConfigError::NoMethods);
}
