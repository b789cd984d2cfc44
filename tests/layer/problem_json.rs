//! Rejection bodies per RFC 9457: a `type` under a base the user chooses, and `instance`,
//! the path of the rejected request.

use std::convert::Infallible;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{ServiceExt, service_fn};
use tower_lock::{ConfigError, LockEngine, LockLayer, LockLayerBuilder, key::PathKey};

async fn rejected_body(layer: LockLayer, engine: &LockEngine, path: &str) -> serde_json::Value {
    let key = layer.locker().key_for(path).unwrap();
    let held = engine.lock_on(key).acquire().await.unwrap();
    let service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let req = Request::post(path).body(String::new()).unwrap();
    let res = service.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::LOCKED);
    held.release().await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn problem_types_default_to_urns_and_carry_the_request_path_as_instance() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(PathKey)
        .build()
        .unwrap();
    let body = rejected_body(layer, &engine, "/reports/7").await;
    assert_eq!(body["type"], "urn:tower-lock:problem:locked");
    assert_eq!(body["instance"], "/reports/7");
    assert_eq!(body["status"], 423);
}

#[tokio::test]
async fn a_problem_type_base_points_the_types_at_the_users_docs() {
    let engine = LockEngine::in_memory();
    let layer = LockLayer::builder(engine.clone())
        .key(PathKey)
        .problem_type_base("https://example.com/problems/")
        .build()
        .unwrap();
    let body = rejected_body(layer, &engine, "/reports/7").await;
    assert_eq!(body["type"], "https://example.com/problems/locked");
    assert_eq!(body["instance"], "/reports/7");
}

#[test]
fn a_problem_type_base_that_is_not_a_uri_is_refused_at_build_time() {
    for bad in ["", "not a uri"] {
        let builder: LockLayerBuilder = LockLayer::builder(LockEngine::in_memory()).key(PathKey);
        let err = builder.problem_type_base(bad).build().unwrap_err();
        assert_eq!(err, ConfigError::ProblemTypeBase(bad.to_owned()));
    }
}
