//! tower-lock-axum on the Redis backend, through real sockets: two axum servers (two
//! nodes, each with its own engine) on one redis-server of the test's own.

use std::{net::SocketAddr, time::Duration};

use axum::{Router, routing::post};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{mpsc, watch},
};
use tower_lock::{LockEngine, LockLayer};
use tower_lock_axum::{Locked, RouteKey};
use tower_lock_test_support::redis::RedisServer;

/// A node: an engine on `redis`, and an axum server whose `/tenants/{id}/jobs` is serialized
/// per tenant. Its handler reports the lock key and fence, then waits for `open`.
async fn node(
    redis: &RedisServer,
    arrived: mpsc::UnboundedSender<(String, u64)>,
    open: watch::Receiver<bool>,
) -> (LockEngine, SocketAddr) {
    let engine = tower_lock_test_support::redis::engine(redis, "axum", None).await;
    let layer = LockLayer::builder(engine.clone())
        .key(RouteKey::param("id"))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/tenants/{id}/jobs",
            post(move |Locked(lease): Locked| {
                let (arrived, mut open) = (arrived.clone(), open.clone());
                async move {
                    arrived
                        .send((lease.key().to_string(), lease.fence().get()))
                        .unwrap();
                    open.wait_for(|o| *o).await.unwrap();
                    "done"
                }
            }),
        )
        .route_layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (engine, addr)
}

/// `POST path` over a fresh connection; the status code.
async fn send_post(addr: SocketAddr, path: &str) -> u16 {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    response[9..12].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_per_tenant_across_nodes_on_redis() {
    let redis = RedisServer::start();
    let (arrived_tx, mut arrived) = mpsc::unbounded_channel();
    let (open_tx, open) = watch::channel(false);
    let (engine, a) = node(&redis, arrived_tx.clone(), open.clone()).await;
    let (_, b) = node(&redis, arrived_tx, open).await;

    let first = tokio::spawn(send_post(a, "/tenants/acme/jobs"));
    let (key, fence) = tokio::time::timeout(Duration::from_secs(10), arrived.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(key, "/axum-route//tenants/{id}/jobs|id=acme");
    assert!(engine.lock(&key).locked().await.unwrap(), "held on Redis");
    // The same tenant on the other node, spelled with a percent-escape: 423.
    assert_eq!(send_post(b, "/tenants/acm%65/jobs").await, 423);
    // Another tenant on the other node runs.
    let other = tokio::spawn(send_post(b, "/tenants/globex/jobs"));
    let (other_key, other_fence) = arrived.recv().await.unwrap();
    assert_eq!(other_key, "/axum-route//tenants/{id}/jobs|id=globex");
    open_tx.send_replace(true);
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(other.await.unwrap(), 200);
    assert!(fence > 0 && other_fence > 0);
    // Released at body end: the next job for the tenant runs on either node.
    assert_eq!(send_post(b, "/tenants/acme/jobs").await, 200);
    let (_, next_fence) = arrived.recv().await.unwrap();
    assert!(next_fence > fence, "fences increase per key across nodes");
}
