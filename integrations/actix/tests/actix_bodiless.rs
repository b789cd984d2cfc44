//! Responses without a body from the actix middleware, through a real socket (actix
//! `HttpServer` on 127.0.0.1:0, hyper-util client), on every backend: actix never polls a
//! body that must be empty, so the middleware releases such a response's key before
//! handing it to actix. The same client's next request for the key must then never meet
//! its own previous lease.

mod support;

use actix_web::{HttpResponse, HttpServer, web};
use http::StatusCode;
use support::spawn_actix;
use tower_lock::{LockEngine, LockLayer, engine::redis::RedisBackend, key::HeaderKey};
use tower_lock_actix::LockMiddleware;
use tower_lock_test_support::redis::RedisServer;

/// Back-to-back requests per kind of response: the race this guards against was lost in
/// about 2 % of requests.
const ROUNDS: usize = 300;

/// Every kind of bodiless response, `ROUNDS` times back to back on one connection for one
/// key, under `wait = 0` (a held key is answered `423` at once): each request gets its
/// own status, never `423`, and the key is free once the last response is in.
async fn bodiless_responses_release_the_key_before_the_client_has_them(engine: LockEngine) {
    let lock = LockMiddleware::new(
        LockLayer::builder(engine.clone())
            .key(HeaderKey::new(http::HeaderName::from_static("x-key")))
            .build_policy()
            .unwrap(),
    );
    let server = HttpServer::new(move || {
        actix_web::App::new().service(
            web::scope("")
                .wrap(lock.clone())
                .route(
                    "/empty",
                    web::get().to(|| async { HttpResponse::Ok().finish() }),
                )
                .route(
                    "/no-content",
                    web::get().to(|| async { HttpResponse::NoContent().finish() }),
                )
                .route(
                    "/not-modified",
                    web::get().to(|| async { HttpResponse::NotModified().finish() }),
                )
                // The handler writes a body, the server sends none.
                .route(
                    "/page",
                    web::head().to(|| async { HttpResponse::Ok().body("a page with a body") }),
                ),
        )
    })
    .workers(2)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    let server = spawn_actix(server.run(), addr);

    let kinds = [
        ("GET", "/empty", StatusCode::OK),
        ("GET", "/no-content", StatusCode::NO_CONTENT),
        ("GET", "/not-modified", StatusCode::NOT_MODIFIED),
        ("HEAD", "/page", StatusCode::OK),
    ];
    let mut refused = Vec::new();
    for (method, path, status) in kinds {
        let mut locked = 0;
        for round in 0..ROUNDS {
            let reply = server.send(method, path, &[("x-key", "k")]).await;
            if reply.status == StatusCode::LOCKED {
                locked += 1;
                continue;
            }
            assert_eq!(reply.status, status, "{method} {path}, round {round}");
            assert!(reply.body.is_empty(), "{method} {path}: {:?}", reply.body);
        }
        refused.push((format!("{method} {path}"), locked));
    }
    assert!(
        refused.iter().all(|(_, locked)| *locked == 0),
        "requests answered 423 (of {ROUNDS} per kind): {refused:?}"
    );
    assert!(
        !engine
            .lock(tower_lock::key::encode("", "header=x-key", "k"))
            .locked()
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_responses_release_the_key_before_the_client_has_them_in_process() {
    bodiless_responses_release_the_key_before_the_client_has_them(LockEngine::in_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_responses_release_the_key_before_the_client_has_them_on_redis() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .prefix("actix-bodiless")
        .build()
        .await
        .expect("connect to the test redis-server");
    bodiless_responses_release_the_key_before_the_client_has_them(LockEngine::new(backend)).await;
}
