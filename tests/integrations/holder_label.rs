//! The holder label a layer stores with each lease: the engine's label and the route the
//! router matched (axum's `MatchedPath`, actix-web's match pattern), never the path the
//! client sent, over real sockets on both frameworks.

use actix_web::{App, web};
use axum::{Router, routing::post};
use tower_lock::{
    LockEngine, LockLayer,
    engine::HolderLabel,
    key::{HeaderKey, encode},
};
use tower_lock_actix::LockMiddleware;
use tower_lock_test_support::{
    gate::{Gate, GateControl, gate},
    http::{TestServer, serve, serve_actix},
};

fn engine() -> LockEngine {
    LockEngine::in_memory().holder_label(HolderLabel::new("web-1:7").unwrap())
}

fn layer(engine: &LockEngine) -> LockLayer {
    LockLayer::builder(engine.clone())
        .key(HeaderKey::new("x-key"))
        .build()
        .unwrap()
}

async fn axum_orders(engine: &LockEngine, gate: Gate) -> TestServer {
    let handler = move || async move {
        let _inside = gate.pass("post".to_owned()).await;
        "done"
    };
    serve(Router::new().route("/orders/{id}", post(handler).route_layer(layer(engine)))).await
}

fn actix_orders(engine: &LockEngine, gate: Gate) -> TestServer {
    let lock = LockMiddleware::try_from(layer(engine)).unwrap();
    serve_actix(2, move || {
        let gate = gate.clone();
        App::new().service(
            web::resource("/orders/{id}").route(
                web::post()
                    .to(move || {
                        let gate = gate.clone();
                        async move {
                            let _inside = gate.pass("post".to_owned()).await;
                            "done"
                        }
                    })
                    .wrap(lock.clone()),
            ),
        )
    })
}

/// While a request to `/orders/42` holds its key, `holders()` names the engine and the
/// route template.
async fn the_holder_label_names_the_route_template(
    engine: LockEngine,
    server: TestServer,
    mut control: GateControl,
) {
    let holder = server.post("/orders/42", &[("x-key", "k")]);
    let look = async {
        control.arrived().await;
        let holders = engine
            .lock(encode("", "header=x-key", "k"))
            .holders()
            .await
            .unwrap();
        control.open();
        holders
    };
    let (reply, holders) = tokio::join!(holder, look);
    assert_eq!(reply.status, http::StatusCode::OK);
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].label(), Some("web-1:7 /orders/{id}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_the_holder_label_names_the_route_template() {
    let (gate, control) = gate();
    let engine = engine();
    let server = axum_orders(&engine, gate).await;
    the_holder_label_names_the_route_template(engine, server, control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_the_holder_label_names_the_route_template() {
    let (gate, control) = gate();
    let engine = engine();
    let server = actix_orders(&engine, gate);
    the_holder_label_names_the_route_template(engine, server, control).await;
}
