//! Criterion micro-benches: the cost of one uncontended lock cycle per backend, and of the
//! lock layer around a trivial service against the bare service.
//!
//! ```sh
//! cargo bench --bench engine                       # memory; Redis if REDIS_URL is set
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench engine
//! ```
//!
//! Each group holds its own baseline (`bare` next to `lock_layer`; memory next to Redis),
//! so the figures to read are ratios within one run.

mod support;

use std::{convert::Infallible, hint::black_box, time::Duration};

use axum::{
    Router,
    body::Body,
    http::{Request, StatusCode},
};
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::BodyExt;
use tokio::runtime::Runtime;
use tower::ServiceExt;
use tower_lock::{LockEngine, LockOptions};

/// A multi-threaded runtime like a server's: the engine's watchdog and release tasks run on
/// it as they would in production.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// One lock cycle (acquire, then release) on the same key, nobody else around.
async fn cycle(engine: &LockEngine, key: &str) {
    let lease = engine
        .lock(key)
        .acquire()
        .await
        .expect("uncontended acquire");
    black_box(lease.fence());
    lease.release().await.expect("release of our own lease");
}

fn engine_benches(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("engine");

    let memory = LockEngine::in_memory();
    group.bench_function("memory/acquire_release", |b| {
        b.to_async(&rt).iter(|| cycle(&memory, "bench:uncontended"))
    });

    let fifo = memory.clone().with_defaults(LockOptions::new().fifo(true));
    group.bench_function("memory/acquire_release_fifo", |b| {
        b.to_async(&rt).iter(|| cycle(&fifo, "bench:uncontended"))
    });

    // A fresh key per cycle, as with idempotency keys: includes creating and removing the
    // key's entry.
    let mut n = 0u64;
    group.bench_function("memory/acquire_release_fresh_key", |b| {
        b.to_async(&rt).iter(|| {
            n += 1;
            let key = format!("bench:fresh:{n}");
            let memory = &memory;
            async move { cycle(memory, &key).await }
        })
    });

    // The refusal path: a held key answers a non-blocking attempt at once.
    let held = rt
        .block_on(memory.lock("bench:held").acquire())
        .expect("acquire");
    group.bench_function("memory/try_acquire_busy", |b| {
        b.to_async(&rt).iter(|| async {
            let refused = memory.lock("bench:held").try_acquire().await;
            black_box(refused.expect_err("the key is held"));
        })
    });
    rt.block_on(held.release()).expect("release");

    match support::redis_url_from_env() {
        None => println!("engine/redis/*: skipped (set REDIS_URL to run against a server)"),
        Some(url) => match rt.block_on(support::redis_engine(&url, "bench")) {
            Err(e) => println!("engine/redis/*: skipped ({e})"),
            Ok(redis) => {
                group.bench_function("redis/acquire_release", |b| {
                    b.to_async(&rt).iter(|| cycle(&redis, "bench:uncontended"))
                });
                let fifo = redis.with_defaults(LockOptions::new().fifo(true));
                group.bench_function("redis/acquire_release_fifo", |b| {
                    b.to_async(&rt).iter(|| cycle(&fifo, "bench:uncontended"))
                });
            }
        },
    }
    group.finish();
}

fn request() -> Request<Body> {
    Request::get("/items/k1")
        .header(support::KEY_HEADER, "k1")
        .body(Body::empty())
        .expect("valid request")
}

/// One request, with the response body read to its end as a server would send it: the
/// layer holds its lease until the body ends, so dropping the body unread would measure
/// the drop path (a release spawned in the background) instead.
async fn call(app: &Router) -> Result<(), Infallible> {
    let response = app.clone().oneshot(request()).await?;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("an in-memory body cannot fail");
    black_box(body);
    Ok(())
}

fn layer_benches(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("layer");
    let bare = support::app();
    group.bench_function("bare", |b| b.to_async(&rt).iter(|| call(&bare)));

    let engine = LockEngine::in_memory();
    let by_hand = support::app_locking_in_handler(engine.clone());
    group.bench_function("lock_in_handler/memory", |b| {
        b.to_async(&rt).iter(|| call(&by_hand))
    });

    let layered = support::with_lock_layer(support::app(), engine, false);
    group.bench_function("lock_layer/memory", |b| {
        b.to_async(&rt).iter(|| call(&layered))
    });
    group.finish();
}

/// Short runs by default: the figures are compared within one run, and the whole suite must
/// fit `benches/run.sh`'s budget on a 2-core machine. Command-line options override these.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = engine_benches, layer_benches
}
criterion_main!(benches);
