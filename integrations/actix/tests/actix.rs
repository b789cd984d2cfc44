//! The actix middleware through a real socket: actix `HttpServer` on 127.0.0.1:0 with
//! several workers, driven by a hyper-util client (a client that is not actix's own, and
//! the one the tower layer's tests use), on the in-process engine. The scenarios are
//! written once in `tower-lock-test-support` and run here as they run under the tower
//! layer (`tests/layer_http.rs`); the parity scenarios put both side by side.

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
