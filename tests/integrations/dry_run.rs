//! A dry run never changes an answer, on axum and on actix, over real sockets: the
//! README's handlers (`Locked` and `LockFence`) answer as they would under the enforcing
//! layer whether the dry run held the key, would have answered `423`, would have waited,
//! or found no key.

use std::time::Duration;

use actix_web::{App, web};
use axum::{Router, routing::post};
use http::StatusCode;
use tower_lock::{LockEngine, LockLayer, key::HeaderKey};
use tower_lock_actix::LockMiddleware;
use tower_lock_test_support::{
    gate::{Gate, GateControl, gate},
    http::{TestServer, serve, serve_actix},
};

/// A dry-run layer keyed on `x-tenant-id`, waiting up to `wait`.
fn dry_run(wait: Duration) -> LockLayer {
    LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new("x-tenant-id"))
        .wait(wait)
        .dry_run(true)
        .build()
        .unwrap()
}

/// The body both frameworks' handlers answer: the fence and whether the info is a dry
/// run's.
fn answer(fence: u64, dry_run: bool) -> String {
    format!("fence {fence} dry run {dry_run}")
}

async fn axum_app(wait: Duration, gate: Gate) -> TestServer {
    use tower_lock_axum::{LockFence, Locked};
    let app = Router::new()
        .route(
            "/jobs",
            post(
                move |Locked(lease): Locked, LockFence(fence): LockFence| async move {
                    let _inside = gate.pass("job".to_owned()).await;
                    assert_eq!(lease.fence(), fence);
                    answer(fence.get(), lease.is_dry_run())
                },
            ),
        )
        .route_layer(dry_run(wait));
    serve(app).await
}

fn actix_app(wait: Duration, gate: Gate) -> TestServer {
    use tower_lock_actix::{LockFence, Locked};
    let lock = LockMiddleware::try_from(dry_run(wait)).unwrap();
    serve_actix(2, move || {
        let gate = gate.clone();
        App::new().service(
            web::resource("/jobs")
                .wrap(lock.clone())
                .route(web::post().to(
                    move |Locked(lease): Locked, LockFence(fence): LockFence| {
                        let gate = gate.clone();
                        async move {
                            let _inside = gate.pass("job".to_owned()).await;
                            assert_eq!(lease.fence(), fence);
                            answer(fence.get(), lease.is_dry_run())
                        }
                    },
                )),
        )
    })
}

/// Two requests at once for one tenant (the second would have been `423`, or would have
/// waited), then one without a key (would have been `400`): each is answered by the
/// handler, `200`; the first holds the dry run's key, the others hold nothing (fence 0).
async fn never_changes_an_answer(server: TestServer, mut control: GateControl) {
    let acme = [("x-tenant-id", "acme")];
    let first = server.post("/jobs", &acme);
    let second = async {
        // The second is sent once the first is inside its handler, holding the key; the
        // gate opens once both are inside, or once the second was answered without
        // entering (the failure this guards against).
        control.arrived().await;
        let second = server.post("/jobs", &acme);
        tokio::pin!(second);
        let reply = tokio::select! {
            reply = &mut second => reply,
            _ = control.arrived() => {
                control.open();
                second.await
            }
        };
        control.open();
        reply
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_ne!(first.text(), answer(0, true));
    assert!(first.text().ends_with("dry run true"), "{}", first.text());
    assert_eq!(second.status, StatusCode::OK, "{}", second.text());
    assert_eq!(second.text(), answer(0, true));
    let keyless = server.post("/jobs", &[]).await;
    assert_eq!(keyless.status, StatusCode::OK, "{}", keyless.text());
    assert_eq!(keyless.text(), answer(0, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_a_dry_run_that_would_have_answered_423_runs_the_extractors() {
    let (gate, control) = gate();
    never_changes_an_answer(axum_app(Duration::ZERO, gate).await, control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_a_dry_run_that_would_have_waited_runs_the_extractors() {
    let (gate, control) = gate();
    never_changes_an_answer(axum_app(Duration::from_secs(30), gate).await, control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_a_dry_run_that_would_have_answered_423_runs_the_extractors() {
    let (gate, control) = gate();
    never_changes_an_answer(actix_app(Duration::ZERO, gate), control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_a_dry_run_that_would_have_waited_runs_the_extractors() {
    let (gate, control) = gate();
    never_changes_an_answer(actix_app(Duration::from_secs(30), gate), control).await;
}
