//! The table of key kinds in the docs (`core/src/docs/lock_key.md`, "Key kinds") is true:
//! every row's extractor, given the table's sample request, locks the row's key, whose
//! kind is the row's kind; and every extractor this test knows has a row.

use std::fmt;

use http::Request;
use tower::ServiceExt;
use tower_lock::{
    IdempotencyLayer, LockEngine, LockLayer, LockLayerBuilder,
    key::{
        self, GlobalKey, HeaderKey, IdempotencyKey, KeyExtractor, MethodPathKey, PathKey,
        Principal, RequestView, ScopedKey,
    },
};
use tower_lock_core::RequestLocker;

const DOCS: &str = include_str!("../../core/src/docs/lock_key.md");

/// The principal of the sample request.
#[derive(Clone)]
struct User(&'static str);

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The table's sample request.
fn sample() -> Request<()> {
    let mut req = Request::post("/reports/7")
        .header("x-tenant-id", "acme")
        .header("idempotency-key", "\"8e03978e\"")
        .header("x-account", "42")
        .body(())
        .unwrap();
    req.extensions_mut().insert(User("alice"));
    req
}

/// The rows of the "Key kinds" table: (extractor, kind, lock key), code spans unquoted.
fn rows() -> Vec<[String; 3]> {
    let table = DOCS
        .split_once("## Key kinds")
        .expect("a Key kinds section")
        .1;
    let unquote = |cell: &str| {
        let cell = cell.trim();
        let code = cell.strip_prefix('`').and_then(|c| c.strip_suffix('`'));
        code.unwrap_or_else(|| panic!("not a code span: {cell:?}"))
            .replace("\\|", "|")
    };
    table
        .lines()
        .skip_while(|line| !line.starts_with("| extractor"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            // Split on the `|` that are not escaped.
            let line = line.replace("\\|", "\u{0}");
            let cells: Vec<String> = line
                .trim_matches('|')
                .split('|')
                .map(|cell| unquote(&cell.replace('\u{0}', "\\|")))
                .collect();
            cells
                .try_into()
                .unwrap_or_else(|c| panic!("three cells: {c:?}"))
        })
        .collect()
}

/// A layer without a namespace keyed by `extractor`.
fn keyed(extractor: impl KeyExtractor) -> RequestLocker {
    LockLayer::builder(LockEngine::in_memory())
        .key(extractor)
        .build_locker()
        .unwrap()
}

/// The lock key the layer of the table's `extractor` takes for the sample request.
fn lock_key(extractor: &str) -> String {
    let idempotency = || IdempotencyLayer::builder(LockEngine::in_memory());
    let done = |builder: LockLayerBuilder| builder.build_locker().unwrap();
    let locker = match extractor {
        r#"HeaderKey::new("x-tenant-id")"# => keyed(HeaderKey::new("x-tenant-id")),
        "IdempotencyKey::new()" => keyed(IdempotencyKey::new()),
        "PathKey" => keyed(PathKey),
        "MethodPathKey" => keyed(MethodPathKey),
        r#"GlobalKey::new("nightly")"# => keyed(GlobalKey::new("nightly")),
        r#"key::from_fn("account", |req| req.header_str("x-account").map(str::to_owned))"# => {
            keyed(key::from_fn("account", |req: &dyn RequestView| {
                req.header_str("x-account").map(str::to_owned)
            }))
        }
        "Principal::<User>::new()" => keyed(Principal::<User>::new()),
        r#"ScopedKey::new("x-tenant-id", IdempotencyKey::new())"# => {
            keyed(ScopedKey::new("x-tenant-id", IdempotencyKey::new()))
        }
        "ScopedKey::by(Principal::<User>::new(), IdempotencyKey::new())" => keyed(ScopedKey::by(
            Principal::<User>::new(),
            IdempotencyKey::new(),
        )),
        // The preset's lock key is its records' key: the same without replay.
        "IdempotencyLayer::builder(engine).per_principal::<User>()" => {
            done(idempotency().per_principal::<User>().without_replay())
        }
        r#"IdempotencyLayer::builder(engine).scope_by(HeaderKey::new("x-tenant-id"))"# => done(
            idempotency()
                .scope_by(HeaderKey::new("x-tenant-id"))
                .without_replay(),
        ),
        r#"tower_lock_axum::RouteKey::param("id")"# => {
            return axum_route_key(tower_lock_axum::RouteKey::param("id"));
        }
        r#"tower_lock_actix::RouteKey::param("id")"# => {
            return actix_route_key(tower_lock_actix::RouteKey::param("id"));
        }
        other => panic!("the table has a row this test does not know: {other}"),
    };
    locker.key(&sample()).unwrap().unwrap().as_str().to_owned()
}

/// The lock key of the sample request routed by axum as `/reports/{id}`.
fn axum_route_key(key: tower_lock_axum::RouteKey) -> String {
    use axum::{Router, body::Body, routing::post};
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(key)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/reports/{id}",
            post(
                |tower_lock_axum::Locked(lease): tower_lock_axum::Locked| async move {
                    lease.key().to_string()
                },
            ),
        )
        .route_layer(layer);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let res = app.oneshot(sample().map(|()| Body::empty())).await.unwrap();
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .unwrap();
        String::from_utf8(body.to_bytes().to_vec()).unwrap()
    })
}

/// The lock key of the sample request routed by actix-web as `/reports/{id}`.
fn actix_route_key(key: tower_lock_actix::RouteKey) -> String {
    use actix_web::{App, test, web};
    let middleware: tower_lock_actix::LockMiddleware = LockLayer::builder(LockEngine::in_memory())
        .key(key)
        .build()
        .unwrap()
        .try_into()
        .unwrap();
    actix_web::rt::System::new().block_on(async move {
        let app = test::init_service(
            App::new().service(web::resource("/reports/{id}").wrap(middleware).route(
                web::post().to(
                    |tower_lock_actix::Locked(lease): tower_lock_actix::Locked| async move {
                        lease.key().as_str().to_owned()
                    },
                ),
            )),
        )
        .await;
        let req = test::TestRequest::post().uri("/reports/7").to_request();
        String::from_utf8(test::call_and_read_body(&app, req).await.to_vec()).unwrap()
    })
}

#[test]
fn the_table_of_key_kinds_is_what_the_extractors_produce() {
    let rows = rows();
    assert!(rows.len() >= 13, "the table lost rows: {rows:#?}");
    for [extractor, kind, expected] in &rows {
        let key = lock_key(extractor);
        assert_eq!(&key, expected, "the lock key of {extractor}");
        let (_, rest) = key.split_once('/').unwrap();
        let (key_kind, _) = rest.split_once('/').unwrap();
        assert_eq!(key_kind, kind, "the kind of {extractor}");
    }
}
