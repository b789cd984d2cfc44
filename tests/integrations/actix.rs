//! The actix middleware through a real socket: actix `HttpServer` on 127.0.0.1:0 with
//! several workers, driven by a hyper-util client (a client that is not actix's own, and
//! the one the tower layer's tests use), on the in-process engine. The scenarios are
//! written once in `tower-lock-test-support` and run here as they run under the tower
//! layer (`tests/layer/in_process.rs`); the parity scenarios put both side by side.

use actix_web::{App, web};
use http::StatusCode;
use tower_lock::{LockEngine, LockLayer};
use tower_lock_actix::{LockFence, LockMiddleware, Locked};
use tower_lock_test_support::{http::serve_actix, scenarios::header_key};

tower_lock_test_support::http_scenarios!(framework = actix, backend = InProcess);
tower_lock_test_support::parity_scenarios!(backend = InProcess);
tower_lock_test_support::unavailable_backend_scenarios!(framework = actix);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractors_see_the_lease_or_fail_with_500_without_one() {
    let lock = LockMiddleware::from(
        LockLayer::builder(LockEngine::in_memory())
            .key(header_key())
            .namespace("t")
            .build()
            .unwrap(),
    );
    let server = serve_actix(1, move || {
        App::new()
            .service(
                web::resource("/locked")
                    .wrap(lock.clone())
                    .route(web::post().to(
                        |Locked(info): Locked, LockFence(fence): LockFence| async move {
                            assert_eq!(info.fence(), fence);
                            format!("{} {}", info.key(), fence.get())
                        },
                    )),
            )
            .route(
                "/bare",
                web::post().to(|lease: Option<Locked>| async move {
                    format!("lease: {}", lease.is_some())
                }),
            )
            .route("/needs-lock", web::post().to(|_: Locked| async { "never" }))
    });

    let reply = server.post("/locked", &[("x-key", "k")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.text().starts_with("t/header=x-key/k "),
        "{}",
        reply.text()
    );
    assert_eq!(server.post("/bare", &[]).await.text(), "lease: false");
    let reply = server.post("/needs-lock", &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(reply.text().contains("middleware"), "{}", reply.text());
}

/// `RouteKey` locks on the matched pattern and the decoded parameters: a resource or a
/// scope (whose path holds the parameter) is keyed per tenant; around the whole `App`,
/// before routing has matched the parameters, the request is answered `400` rather than
/// locked per route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_keys_lock_per_matched_route_and_parameter() {
    use tower_lock_actix::RouteKey;
    let engine = LockEngine::in_memory();
    let layer = |key: RouteKey| -> LockMiddleware {
        LockLayer::builder(engine.clone())
            .key(key)
            .build_locker()
            .unwrap()
            .into()
    };
    let (resource, scope, app_wide) = (
        layer(RouteKey::param("id")),
        layer(RouteKey::params()),
        layer(RouteKey::params()),
    );
    let echo =
        || web::post().to(|Locked(lease): Locked| async move { lease.key().as_str().to_owned() });
    let server = serve_actix(1, move || {
        App::new()
            .service(
                web::resource("/tenants/{id}/jobs")
                    .wrap(resource.clone())
                    .route(echo()),
            )
            .service(
                web::scope("/shops/{shop}")
                    .wrap(scope.clone())
                    .route("/orders/{order}", echo()),
            )
    });
    let key = server.post("/tenants/acm%65/jobs", &[]).await;
    assert_eq!(key.status, StatusCode::OK, "{}", key.text());
    assert_eq!(key.text(), "/actix-route//tenants/{id}/jobs|id=acme");
    let slash = server.post("/tenants/a%2Fb%7C/jobs", &[]).await;
    assert_eq!(slash.text(), "/actix-route//tenants/{id}/jobs|id=a/b%7C");

    let scoped = server.post("/shops/7/orders/9", &[]).await;
    assert_eq!(scoped.status, StatusCode::OK, "{}", scoped.text());
    assert!(scoped.text().contains("|shop=7"), "{}", scoped.text());

    let app_wide_server = serve_actix(1, move || {
        App::new()
            .wrap(app_wide.clone())
            .route("/t/{id}", web::post().to(|| async { "ran" }))
    });
    // Around the whole App no parameter is matched yet: the server's mistake, a 500 (the
    // cause, to wrap the web::resource instead, goes to the log).
    let unrouted = app_wide_server.post("/t/7", &[]).await;
    assert_eq!(
        unrouted.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        unrouted.text()
    );
    assert!(
        unrouted
            .text()
            .contains("urn:tower-lock:problem:misconfigured"),
        "{}",
        unrouted.text()
    );
}

/// A header name given as text needs no `http` type, and an invalid one fails `build`.
#[test]
fn header_keys_named_by_text_are_checked_when_built() {
    use tower_lock::{ConfigError, key::HeaderKey};
    let ok = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::named("X-Tenant-Id"))
        .build_locker();
    assert!(ok.is_ok());
    let bad = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::named("x tenant"))
        .build_locker();
    assert!(matches!(bad, Err(ConfigError::Extractor(_))), "{bad:?}");
}
