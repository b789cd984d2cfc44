//! The examples, driven over a real socket so that they cannot rot: each example's app
//! is built by the example's own code (included here as a module) and answers the
//! statuses its docs and the README promise.
//!
//! The keys are held directly on the engine (as another request would hold them), so the
//! contended answers do not depend on how long a handler sleeps.
//!
//! With the `metrics` feature, `prometheus` scrapes `examples/prometheus.rs`.

// Each example is a crate of its own with its own `mod common;`; included side by side
// here, the shared module is loaded once per example.
#![allow(clippy::duplicate_mod)]

// `examples/prometheus.rs` installs the process's `metrics` recorder.
#[cfg(feature = "metrics")]
mod prometheus;

#[path = "../../examples/demo.rs"]
#[allow(dead_code)]
mod demo;

#[path = "../../examples/tenant_fifo.rs"]
#[allow(dead_code)]
mod tenant_fifo;

#[path = "../../examples/actix.rs"]
#[allow(dead_code)]
mod actix_example;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use actix_web::App;
use http::StatusCode;
use tower_lock::LockEngine;
use tower_lock_test_support::{
    http::{Reply, serve, serve_actix},
    scenarios::{hold, wait_for_waiters},
};

fn assert_problem(reply: &Reply, status: StatusCode, kind: &str) {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        reply.json()["type"],
        format!("urn:tower-lock:problem:{kind}")
    );
    assert_eq!(reply.json()["status"], status.as_u16());
}

fn assert_retry_after(reply: &Reply) {
    let secs: u64 = reply
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=10).contains(&secs), "Retry-After {secs}");
}

/// The lock key of alice's `order-1` in the demo: scoped per account.
const ALICE_ORDER_1: &str = "/scope(principal,idempotency-key)/alice/order-1";

#[tokio::test]
async fn demo_answers_201_409_400_423_429_and_404_as_the_readme_shows() {
    let engine = LockEngine::in_memory();
    let server = serve(demo::app(engine.clone(), Duration::ZERO).unwrap()).await;
    let alice = ("authorization", "Bearer alice");
    let key = |k: &'static str| [("idempotency-key", k), alice];

    let order_as = |account: &'static str, k: &'static str, body: &'static str| {
        let server = &server;
        async move {
            let bearer = format!("Bearer {account}");
            server
                .send_body(
                    "POST",
                    "/orders",
                    &[("idempotency-key", k), ("authorization", &bearer)],
                    body,
                )
                .await
        }
    };
    let order = |k, body| order_as("alice", k, body);
    let created = order("\"order-1\"", "{\"sku\":42}").await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    assert_eq!(created.json()["lock"], ALICE_ORDER_1);
    assert_eq!(created.json()["order"]["sku"], 42);
    // Completed: the same request is replayed, the handler does not run again.
    let replayed = order("\"order-1\"", "{\"sku\":42}").await;
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    assert_eq!(replayed.body, created.body);
    let reused = order("\"order-1\"", "{\"sku\":43}").await;
    assert_problem(
        &reused,
        StatusCode::UNPROCESSABLE_ENTITY,
        "fingerprint-mismatch",
    );
    // Another account with the same key and body runs its own order.
    let bob = order_as("bob", "\"order-1\"", "{\"sku\":42}").await;
    assert_eq!(bob.status, StatusCode::CREATED, "{}", bob.text());
    assert_eq!(bob.header("idempotent-replayed"), None);
    assert_eq!(
        bob.json()["lock"],
        ALICE_ORDER_1.replace("/alice/", "/bob/")
    );

    let missing = server.post("/orders", &[alice]).await;
    assert_problem(&missing, StatusCode::BAD_REQUEST, "missing-key");
    let anonymous = server
        .post("/orders", &[("idempotency-key", "\"o\"")])
        .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    let _order = hold(&engine, &ALICE_ORDER_1.replace("order-1", "order-2")).await;
    let duplicate = server.post("/orders", &key("\"order-2\"")).await;
    assert_problem(&duplicate, StatusCode::CONFLICT, "conflict");
    assert_retry_after(&duplicate);

    let _import = hold(&engine, "/axum-route//tenants/{id}/import|id=acme").await;
    let locked = server.post("/tenants/acme/import", &[]).await;
    assert_problem(&locked, StatusCode::LOCKED, "locked");
    assert_retry_after(&locked);
    let other = server.post("/tenants/globex/import", &[]).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text());

    let _jobs = hold(&engine, "/axum-route//tenants/{id}/jobs|id=acme").await;
    let timed_out = server.post("/tenants/acme/jobs", &[]).await;
    assert_problem(&timed_out, StatusCode::TOO_MANY_REQUESTS, "wait-timed-out");
    assert_retry_after(&timed_out);
    let other = server.post("/tenants/globex/jobs", &[]).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text());
    assert_eq!(other.json()["tenant"], "globex");

    // route_layer: an unknown path takes no lock and stays a 404.
    assert_eq!(
        server.post("/tenants/acme/unknown", &[]).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn demo_prints_a_curl_session_for_its_address() {
    let hint = demo::curl_hint(SocketAddr::from(([127, 0, 0, 1], 4567)), Duration::ZERO);
    assert!(hint.contains("curl -si -X POST http://127.0.0.1:4567/orders"));
    assert!(hint.contains("/tenants/acme/jobs"));
    // The session shows a replay (the first order's request again, once it is done) and a
    // 422 (its key with another body).
    let first =
        "-H 'Authorization: Bearer alice' -H 'Idempotency-Key: \"order-1\"' -d '{\"sku\":42}'";
    assert!(hint.matches(first).count() >= 3, "{hint}");
    assert!(hint.contains("sleep 1; curl"), "{hint}");
    assert!(hint.contains("{\"sku\":43}"), "{hint}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_fifo_runs_one_tenants_jobs_in_arrival_order_and_other_tenants_alongside() {
    const N: usize = 5;
    let engine = LockEngine::in_memory();
    let server = Arc::new(serve(tenant_fifo::app(engine.clone(), Duration::ZERO).unwrap()).await);

    // An earlier job of acme holds the key while the others arrive one by one.
    let first = hold(&engine, "jobs/header=x-tenant-id/acme").await;
    let mut jobs = Vec::new();
    for n in 0..N {
        let server = server.clone();
        jobs.push(tokio::spawn(async move {
            let job = n.to_string();
            server
                .post("/jobs", &[("x-tenant-id", "acme"), ("x-job", &job)])
                .await
        }));
        wait_for_waiters(&engine, "jobs/header=x-tenant-id/acme", n + 1).await;
    }
    // Another tenant is not held up by acme's queue.
    let globex = server
        .post("/jobs", &[("x-tenant-id", "globex"), ("x-job", "g")])
        .await;
    assert_eq!(globex.status, StatusCode::OK, "{}", globex.text());
    assert_eq!(globex.json()["lock"], "jobs/header=x-tenant-id/globex");

    drop(first);
    let mut fences = Vec::new();
    for (n, job) in jobs.into_iter().enumerate() {
        let reply = job.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.json()["job"], n.to_string());
        fences.push(reply.json()["fence"].as_u64().unwrap());
    }
    // Fences grow with each grant: granted in the order the jobs arrived.
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");

    let no_tenant = server.post("/jobs", &[]).await;
    assert_problem(&no_tenant, StatusCode::BAD_REQUEST, "missing-key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actix_example_answers_like_the_demo_across_workers() {
    let engine = LockEngine::in_memory();
    let guards = actix_example::Guards::new(engine.clone(), Duration::ZERO).unwrap();
    let server = serve_actix(2, move || {
        App::new().configure(|cfg| actix_example::routes(cfg, &guards))
    });

    let alice = ("authorization", "Bearer alice");
    let created = server
        .post("/orders", &[("idempotency-key", "\"order-1\""), alice])
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let bob = server
        .post(
            "/orders",
            &[
                ("idempotency-key", "\"order-1\""),
                ("authorization", "Bearer bob"),
            ],
        )
        .await;
    assert_eq!(bob.status, StatusCode::CREATED, "{}", bob.text());
    assert_eq!(bob.header("idempotent-replayed"), None, "bob runs his own");

    let missing = server.post("/orders", &[alice]).await;
    assert_problem(&missing, StatusCode::BAD_REQUEST, "missing-key");
    let anonymous = server
        .post("/orders", &[("idempotency-key", "\"order-1\"")])
        .await;
    assert_eq!(
        anonymous.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        anonymous.text()
    );

    let _order = hold(&engine, "/scope(account,idempotency-key)/alice/order-2").await;
    let duplicate = server
        .post("/orders", &[("idempotency-key", "\"order-2\""), alice])
        .await;
    assert_problem(&duplicate, StatusCode::CONFLICT, "conflict");
    assert_retry_after(&duplicate);

    let _import = hold(&engine, "/actix-route//tenants/{id}/import|id=acme").await;
    let locked = server.post("/tenants/acme/import", &[]).await;
    assert_problem(&locked, StatusCode::LOCKED, "locked");
    assert_retry_after(&locked);
    // Another spelling of acme is acme: the parameter is percent-decoded.
    let respelled = server.post("/tenants/acm%65/import", &[]).await;
    assert_problem(&respelled, StatusCode::LOCKED, "locked");
    let other = server.post("/tenants/globex/import", &[]).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text());

    let _jobs = hold(&engine, "/actix-route//tenants/{id}/jobs|id=acme").await;
    let timed_out = server.post("/tenants/acme/jobs", &[]).await;
    assert_problem(&timed_out, StatusCode::TOO_MANY_REQUESTS, "wait-timed-out");
    assert_retry_after(&timed_out);
    let other = server.post("/tenants/globex/jobs", &[]).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text());

    assert_eq!(
        server.post("/unknown", &[]).await.status,
        StatusCode::NOT_FOUND
    );
}

#[path = "../../examples/engine.rs"]
#[allow(dead_code)]
mod engine_example;

#[tokio::test]
async fn engine_example_takes_turns_and_its_storage_refuses_a_stale_fence() {
    let engine = LockEngine::in_memory();
    let store = engine_example::FencedStore::default();
    engine_example::take_turns(&engine, &store).await.unwrap();
    assert!(store.read("invoice:42").unwrap().starts_with("worker "));

    let refused = engine_example::stale_holder_is_refused(&engine, &store)
        .await
        .unwrap();
    assert!(refused.offered < refused.seen);
    assert_eq!(store.read("invoice:7").as_deref(), Some("paid"));
}

#[path = "../../examples/engine_tools.rs"]
mod engine_tools;

/// The tools example runs to the end without an error (its operations are specified by the
/// conformance suite; this keeps the example itself from rotting).
#[test]
fn engine_tools_example_runs() {
    engine_tools::main().expect("engine_tools example");
}
