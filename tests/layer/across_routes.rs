//! A route parameter as the key across routes (`RouteKey::param("id").across_routes()`):
//! `GET /tenants/{id}/report` and `POST /tenants/{id}/reindex` share a tenant's key, so
//! under `shared_for` reports run side by side and a reindex excludes them.

use axum::{
    Router,
    routing::{get, post},
};
use http::{Method, StatusCode};
use tower_lock::{LockEngine, LockLayer};
use tower_lock_axum::{Locked, RouteKey};
use tower_lock_test_support::{gate::gate, http::serve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parameter_across_routes_shares_one_key_between_reads_and_writes() {
    let (gate, mut control) = gate();
    let layer = LockLayer::builder(LockEngine::in_memory())
        .key(RouteKey::param("id").across_routes())
        .shared_for([Method::GET])
        .build()
        .unwrap();
    let report = move |Locked(lease): Locked| {
        let gate = gate.clone();
        async move {
            let _inside = gate.pass(lease.key().to_string()).await;
            "report"
        }
    };
    let app = Router::new()
        .route("/tenants/{id}/report", get(report))
        .route(
            "/tenants/{id}/reindex",
            post(|Locked(lease): Locked| async move { lease.key().to_string() }),
        )
        .route_layer(layer);
    let server = serve(app).await;

    let reading = server.send("GET", "/tenants/7/report", &[]);
    let others = async {
        // One key per tenant, whatever the route.
        assert_eq!(control.arrived().await, "/axum-route/*|id=7");
        // Another report of the tenant runs beside it (shared).
        let second = server.send("GET", "/tenants/7/report", &[]);
        let check = async {
            assert_eq!(control.arrived().await, "/axum-route/*|id=7");
            // A reindex of the tenant, on another route, meets the readers: 423.
            let busy = server.post("/tenants/7/reindex", &[]).await;
            assert_eq!(busy.status, StatusCode::LOCKED, "{}", busy.text());
            // Another tenant's reindex runs, under its own key.
            let other = server.post("/tenants/8/reindex", &[]).await;
            assert_eq!(other.status, StatusCode::OK);
            assert_eq!(other.text(), "/axum-route/*|id=8");
            control.open();
        };
        let (second, ()) = tokio::join!(second, check);
        assert_eq!(second.status, StatusCode::OK);
    };
    let (reading, ()) = tokio::join!(reading, others);
    assert_eq!(reading.status, StatusCode::OK);
    // The readers are done: the tenant's reindex runs.
    let reindex = server.post("/tenants/7/reindex", &[]).await;
    assert_eq!(reindex.status, StatusCode::OK);
}
