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
    let lock = LockMiddleware::try_from(
        LockLayer::builder(LockEngine::in_memory())
            .key(header_key())
            .namespace("t")
            .build()
            .unwrap(),
    )
    .unwrap();
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
            .build()
            .unwrap()
            .try_into()
            .unwrap()
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
        .key(HeaderKey::new("X-Tenant-Id"))
        .build();
    assert!(ok.is_ok());
    let actix_name = actix_web::http::header::HeaderName::from_static("x-tenant-id");
    let ok = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new(actix_name))
        .build();
    assert!(ok.is_ok());
    let bad = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x tenant"))
        .build();
    assert!(matches!(bad, Err(ConfigError::Extractor(_))), "{bad:?}");
}

/// actix-web requests carry no `http` extensions, so a principal scope could never find
/// its principal: making the middleware from such a layer fails, and says to scope by a
/// header instead. A key that does not need the extensions (a header scope) is accepted.
#[test]
fn a_principal_scope_is_refused_when_the_actix_middleware_is_made() {
    use std::fmt;
    use tower_lock::{
        IdempotencyLayer,
        key::{HeaderKey, IdempotencyKey, Principal, ScopedKey},
    };
    use tower_lock_actix::ReplayMiddleware;

    struct UserId(u64);
    impl fmt::Display for UserId {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}", self.0)
        }
    }
    let assert_refused = |error: &dyn fmt::Display| {
        let message = error.to_string();
        assert!(message.contains("extensions"), "{message}");
        assert!(message.contains("key::from_fn"), "{message}");
    };

    let replay = IdempotencyLayer::builder(LockEngine::in_memory())
        .per_principal::<UserId>()
        .build()
        .unwrap();
    assert_refused(&ReplayMiddleware::try_from(replay).map(drop).unwrap_err());
    let without_replay = IdempotencyLayer::builder(LockEngine::in_memory())
        .per_principal::<UserId>()
        .without_replay()
        .build()
        .unwrap();
    assert_refused(
        &LockMiddleware::try_from(without_replay)
            .map(drop)
            .unwrap_err(),
    );
    let principal_key = LockLayer::builder(LockEngine::in_memory())
        .key(ScopedKey::by(
            Principal::<UserId>::new(),
            IdempotencyKey::new(),
        ))
        .build()
        .unwrap();
    assert_refused(
        &LockMiddleware::try_from(&principal_key)
            .map(drop)
            .unwrap_err(),
    );

    let by_header = IdempotencyLayer::builder(LockEngine::in_memory())
        .scope_by(HeaderKey::new("x-tenant-id"))
        .build()
        .unwrap();
    assert!(ReplayMiddleware::try_from(by_header).is_ok());
}

/// actix-web's own `Method` (of `http` 0.2) names the locked methods: no second `http`
/// crate in an actix application.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_are_named_with_actix_types() {
    use actix_web::http::Method;
    use tower_lock::key::PathKey;
    let lock: LockMiddleware = LockLayer::builder(LockEngine::in_memory())
        .key(PathKey)
        .methods([Method::PUT, Method::GET])
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let server =
        serve_actix(1, move || {
            App::new().service(web::resource("/jobs").wrap(lock.clone()).to(
            |lease: Option<Locked>| async move { format!("locked: {}", lease.is_some()) },
        ))
        });
    for (method, expected) in [("PUT", true), ("GET", true), ("POST", false)] {
        let reply = server.send(method, "/jobs", &[]).await;
        assert_eq!(reply.text(), format!("locked: {expected}"), "{method}");
    }
}

/// Reads one HTTP/1.1 response (head and a `content-length` body) from `stream`; `None`
/// when the server closed the connection instead.
async fn read_response(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + length {
                return Some(String::from_utf8_lossy(&buf[..end + 4 + length]).into_owned());
            }
        }
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut chunk))
                .await
                .expect("a response within 10 s")
                .unwrap_or(0);
        if read == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..read]);
    }
}

/// A rejection leaves the connection open, as the tower layer does: the request body the
/// handler never read is drained (it is small), so the client's next request on the same
/// connection is served, after a `400` (no key) as after a `423` (key held), under the
/// lock and the replay middleware alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_keeps_the_connection_alive() {
    use tokio::io::AsyncWriteExt;
    use tower_lock::{IdempotencyLayer, key::HeaderKey};
    use tower_lock_actix::ReplayMiddleware;

    let engine = LockEngine::in_memory();
    let lock: LockMiddleware = LockLayer::builder(engine.clone())
        .key(HeaderKey::new("x-key"))
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let replay: ReplayMiddleware = IdempotencyLayer::builder(engine.clone())
        .unscoped()
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let server = serve_actix(1, move || {
        App::new()
            .service(
                web::resource("/jobs")
                    .wrap(lock.clone())
                    .route(web::post().to(|| async { "ran" })),
            )
            .service(
                web::resource("/orders")
                    .wrap(replay.clone())
                    .route(web::post().to(|| async { "ordered" })),
            )
    });
    let post = |path: &str, header: &str| {
        let body = r#"{"name":"a b"}"#;
        format!(
            "POST {path} HTTP/1.1\r\nhost: test\r\n{header}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };

    for (path, key) in [
        ("/jobs", "x-key: k\r\n"),
        ("/orders", "idempotency-key: \"o-1\"\r\n"),
    ] {
        let mut stream = server.raw(&post(path, "")).await;
        let rejected = read_response(&mut stream).await.unwrap();
        assert!(rejected.starts_with("HTTP/1.1 400"), "{rejected}");
        assert!(
            !rejected.to_ascii_lowercase().contains("connection: close"),
            "{rejected}"
        );
        stream.write_all(post(path, key).as_bytes()).await.unwrap();
        let served = read_response(&mut stream).await;
        assert!(
            served
                .as_deref()
                .is_some_and(|r| r.starts_with("HTTP/1.1 200")),
            "{path}: the connection was closed after the 400: {served:?}"
        );
    }

    let held = engine.lock("/header=x-key/k").acquire().await.unwrap();
    let mut stream = server.raw(&post("/jobs", "x-key: k\r\n")).await;
    let locked = read_response(&mut stream).await.unwrap();
    assert!(locked.starts_with("HTTP/1.1 423"), "{locked}");
    held.release().await.unwrap();
    stream
        .write_all(post("/jobs", "x-key: k\r\n").as_bytes())
        .await
        .unwrap();
    let served = read_response(&mut stream).await;
    assert!(
        served
            .as_deref()
            .is_some_and(|r| r.starts_with("HTTP/1.1 200")),
        "the connection was closed after the 423: {served:?}"
    );
}

/// A scope is the server's to derive: an idempotency layer scoped by a closure that finds
/// no principal (the authentication middleware forgotten or ordered after it) answers
/// `500 misconfigured` naming the cause, never a `400` that blames the client, and runs
/// nothing. The closure is the README's, returning `Option`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_closure_that_finds_no_principal_is_the_servers_mistake() {
    use actix_web::HttpMessage;
    use tower_lock::{IdempotencyLayer, key};
    use tower_lock_actix::ReplayMiddleware;

    #[derive(Clone)]
    struct AccountId(u64);

    let orders: ReplayMiddleware = IdempotencyLayer::builder(LockEngine::in_memory())
        .scope_by(key::from_fn("account", |req| {
            let req = tower_lock_actix::http_request(req)?;
            req.extensions().get::<AccountId>().map(|a| a.0.to_string())
        }))
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let server = serve_actix(1, move || {
        let counted = counted.clone();
        App::new().service(
            web::resource("/orders")
                .wrap(orders.clone())
                .route(web::post().to(move || {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async { "ran" }
                })),
        )
    });
    let reply = server.post("/orders", &[("idempotency-key", "k1")]).await;
    assert_eq!(
        reply.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        reply.text()
    );
    assert!(
        reply
            .text()
            .contains("urn:tower-lock:problem:misconfigured"),
        "{}",
        reply.text()
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);
}
