//! Per-tenant serialization with first-come-first-served waiting.
//!
//! `POST /jobs` runs one job at a time per tenant (the `X-Tenant-Id` header). Jobs of one
//! tenant queue up and run in the order they arrived; jobs of different tenants run side
//! by side. The example starts the service, sends six jobs for two tenants at once, and
//! prints the order they ran in.
//!
//! ```sh
//! cargo run --example tenant_fifo
//! REDIS_URL=redis://127.0.0.1/ cargo run --example tenant_fifo   # FIFO across nodes
//! DATABASE_URL=postgres://app@127.0.0.1/app cargo run --features postgres --example tenant_fifo
//! ```

mod common;

use std::{error::Error, time::Duration};

use axum::{Json, Router, http::HeaderMap, routing::post};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tower_lock::{ConfigError, LockEngine, LockLayer, key::HeaderKey};
use tower_lock_axum::Locked;

/// The job service: one job at a time per tenant, in arrival order; each job takes `work`.
pub(crate) fn app(engine: LockEngine, work: Duration) -> Result<Router, ConfigError> {
    let per_tenant = LockLayer::builder(engine)
        .key(HeaderKey::new("x-tenant-id"))
        // Namespaced, so these locks are apart from those of other layers on the engine
        // (the lock of acme is `jobs/header=x-tenant-id/acme`).
        .namespace("jobs")
        // Wait in line for up to 30 s, strictly first come first served; at most 16 in
        // line per tenant, more are turned away with 429 at once.
        .wait(Duration::from_secs(30))
        .fifo(true)
        .max_waiters(16)
        .build()?;
    Ok(Router::new()
        .route(
            "/jobs",
            post(
                move |headers: HeaderMap, Locked(lease): Locked| async move {
                    tokio::time::sleep(work).await;
                    let job = headers
                        .get("x-job")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    Json(json!({
                        "job": job,
                        "lock": lease.key().as_str(),
                        "fence": lease.fence().get(),
                        "waited_ms": lease.waited().as_millis() as u64,
                    }))
                },
            ),
        )
        .route_layer(per_tenant))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let engine = common::engine_from_env().await;
    let listener = TcpListener::bind(common::listen_addr(0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(axum::serve(listener, app(engine, Duration::from_millis(200))?).into_future());
    println!("job service on http://{addr}; each job takes 200 ms\n");

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut jobs = Vec::new();
    for (n, tenant) in ["acme", "acme", "globex", "acme", "globex", "acme"]
        .into_iter()
        .enumerate()
    {
        let job = format!("{tenant}-{n}");
        let req = http::Request::post(format!("http://{addr}/jobs"))
            .header("x-tenant-id", tenant)
            .header("x-job", &job)
            .body(Empty::new())?;
        println!("sent     {job}");
        let client = client.clone();
        jobs.push(tokio::spawn(async move {
            let res = client.request(req).await?;
            let body = res.into_body().collect().await?.to_bytes();
            let v: Value = serde_json::from_slice(&body)?;
            println!(
                "finished {} (fence {}, waited {} ms)",
                v["job"].as_str().unwrap_or(""),
                v["fence"],
                v["waited_ms"]
            );
            Ok::<_, Box<dyn Error + Send + Sync>>(())
        }));
        // Space the sends out a little so that their arrival order is the order above.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for job in jobs {
        job.await?.map_err(|e| e as Box<dyn Error>)?;
    }
    println!("\nacme's jobs ran one after another in the order sent; globex's ran alongside.");
    Ok(())
}
