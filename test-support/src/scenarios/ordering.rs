//! Requests for one key take turns: never two in the handler, and in arrival order under
//! FIFO.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use actix_web::{App, web};
use http::StatusCode;
use tower_lock_actix::{LockFence, LockMiddleware};

use super::{
    Backend, FOR_K, Handler, Routes, Stack, inside, lock_key, reaches_its_handler, spawn_post,
    wait_for_waiters,
};
use crate::{gate::gate, http::serve_actix};

/// Under FIFO, requests for one key run one at a time in the order they arrived, with
/// increasing fences, across a fleet of servers (on Redis each with an engine of its own,
/// so the order comes from the Redis ticket queue, not from one process's waiters).
pub async fn fifo_requests_with_one_key_never_overlap_and_run_in_arrival_order(on: Stack) {
    const N: usize = 8;
    const ROUNDS: usize = 3;
    const NODES: usize = 3;
    let table = on.table("fifo").await;
    let (gate, mut control) = gate();
    let mut servers = Vec::new();
    for _ in 0..NODES {
        let layer = table.node_layer().await.wait(Duration::from_secs(20));
        let layer = layer.fifo(true).build().unwrap();
        let routes = Routes::new().post("/work", &layer, Handler::Gated(gate.clone()));
        servers.push(on.serve(routes).await);
    }
    let engine = table.engine();

    let mut last_fence = 0;
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for seq in 0..N {
            let seq_header = seq.to_string();
            let headers = [("x-key", "k"), ("x-seq", seq_header.as_str())];
            let mut task = spawn_post(&servers[seq % NODES], "/work", &headers);
            if seq == 0 {
                reaches_its_handler(&mut control, &mut task, "0").await;
            } else {
                // Arrival order is the order of the engine's queue (waiters on all nodes
                // count).
                wait_for_waiters(&engine, &lock_key("k"), seq).await;
            }
            tasks.push(task);
        }
        for expected in 0..N {
            if expected > 0 {
                let seq = control.arrived().await;
                assert_eq!(
                    seq,
                    expected.to_string(),
                    "round {round}: grants follow arrival order"
                );
            }
            assert_eq!(
                control.inside(),
                1,
                "round {round}: request {expected} is alone in the handler"
            );
            control.let_one();
        }
        for task in tasks {
            let reply = task.await.unwrap();
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
            let fence: u64 = reply.text()["fence:".len()..].parse().unwrap();
            assert!(fence > last_fence, "round {round}: fences increase");
            last_fence = fence;
        }
    }
    assert_eq!(control.most_inside(), 1);
    table.assert_no_residue(&[lock_key("k")]).await;
}

/// Without FIFO, requests that wait for one key still never overlap: everyone queues
/// behind the holder.
pub async fn waiting_requests_without_fifo_never_overlap(on: Stack) {
    const N: usize = 8;
    let table = on.table("no-fifo").await;
    let layer = table.layer().wait(Duration::from_secs(20));
    let (server, mut control) = on.serve_gated(&layer.build().unwrap()).await;
    let first = inside(&server, "/work", FOR_K, &mut control).await;
    let mut tasks = vec![first];
    for _ in 1..N {
        tasks.push(spawn_post(&server, "/work", FOR_K));
    }
    wait_for_waiters(&table.engine(), &lock_key("k"), N - 1).await;
    // Everyone queued behind the holder: no second handler got in meanwhile.
    assert_eq!(control.try_arrived(), None);
    control.open();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    assert_eq!(control.most_inside(), 1);
    table.assert_no_residue(&[lock_key("k")]).await;
}

/// actix runs handlers on several worker threads: one middleware, built once outside the
/// app factory, excludes across all of them, and across nodes (two servers on one lock
/// table).
pub async fn requests_with_one_key_never_overlap_across_workers(backend: Backend) {
    const N: usize = 16;
    const WORKERS: usize = 4;
    const NODES: usize = 2;
    let table = backend.table("across-workers").await;
    let in_handler = Arc::new(AtomicUsize::new(0));
    let max_in_handler = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let threads = Arc::new(Mutex::new(HashSet::new()));
    let mut servers = Vec::new();
    for _ in 0..NODES {
        // Built once, outside the app factory: every worker locks on this one table.
        let lock = LockMiddleware::try_from(
            table
                .node_layer()
                .await
                .wait(Duration::from_secs(30))
                .fifo(true)
                .build()
                .unwrap(),
        )
        .unwrap();
        let (in_handler, max_in_handler, fences, threads) = (
            in_handler.clone(),
            max_in_handler.clone(),
            fences.clone(),
            threads.clone(),
        );
        let server = serve_actix(WORKERS, move || {
            let (in_handler, max_in_handler, fences, threads) = (
                in_handler.clone(),
                max_in_handler.clone(),
                fences.clone(),
                threads.clone(),
            );
            let handler = move |LockFence(fence): LockFence| {
                let (in_handler, max_in_handler, fences, threads) = (
                    in_handler.clone(),
                    max_in_handler.clone(),
                    fences.clone(),
                    threads.clone(),
                );
                async move {
                    let now = in_handler.fetch_add(1, Ordering::SeqCst) + 1;
                    max_in_handler.fetch_max(now, Ordering::SeqCst);
                    threads.lock().unwrap().insert(std::thread::current().id());
                    fences.lock().unwrap().push(fence);
                    // Hold the handler open long enough for a request on another worker or
                    // node to overlap it, if the lock let one through.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    in_handler.fetch_sub(1, Ordering::SeqCst);
                    "done"
                }
            };
            App::new().service(
                web::resource("/work")
                    .wrap(lock.clone())
                    .route(web::post().to(handler)),
            )
        });
        servers.push(Arc::new(server));
    }

    let mut tasks = Vec::new();
    for i in 0..N {
        tasks.push(spawn_post(&servers[i % NODES], "/work", FOR_K));
    }
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    assert_eq!(
        max_in_handler.load(Ordering::SeqCst),
        1,
        "handlers overlapped"
    );
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), N);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences increase in handler order: {fences:?}"
    );
    // The exclusion held across threads, not merely within one worker.
    assert!(
        threads.lock().unwrap().len() > 1,
        "all requests were served by one worker"
    );
    table.assert_no_residue(&[lock_key("k")]).await;
}
