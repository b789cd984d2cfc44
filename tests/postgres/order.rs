//! A node's calls of one key reach the database in the order they were made, though each
//! may take another pooled connection: an acquire made right after this node's own release
//! of the key keeps its place ahead of acquires made later, however late that release is
//! answered.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::Poll,
    time::Duration,
};

use tower_lock::engine::{
    LockEngine,
    postgres::sqlx::{self, Executor},
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::{backend, until_lock_waits};

type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Make the call `f` now (polled once, here), and hand it to the runtime.
async fn call_now(mut f: Call) -> tokio::task::JoinHandle<()> {
    std::future::poll_fn(|cx| {
        let _ = f.as_mut().poll(cx);
        Poll::Ready(())
    })
    .await;
    tokio::spawn(f)
}

/// `x` releases (its release held up by a row lock on the key's row), then at once acquires
/// again; `y` acquires after that. `x` must get the key first. Before acquires were lined
/// up, `x`'s acquire waited for its release's answer while `y`'s went ahead and took the
/// key the release freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_after_a_slow_release_of_its_key_keeps_its_place() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    let backend = backend(url, None, "order").await;
    let table = format!(
        "\"{}\".\"{}locks\"",
        backend.schema(),
        backend.table_prefix()
    );
    let engine = LockEngine::new(backend.clone());
    for round in 0..5 {
        let key = format!("order-{round}");
        let lock = engine
            .lock(&key)
            .fifo(true)
            .wait(Duration::from_secs(20))
            .ttl(Duration::from_secs(20));
        let x = lock.acquire().await.unwrap();
        // The key's row locked: the release's update of it waits for this transaction.
        let mut blocker = backend.pool().begin().await.unwrap();
        blocker
            .execute(sqlx::raw_sql(&format!(
                "SELECT 1 FROM {table} WHERE key = '{key}' FOR UPDATE"
            )))
            .await
            .unwrap();
        let released = tokio::spawn(x.release());
        until_lock_waits(&backend, 1).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut calls = Vec::new();
        for who in ["x", "y"] {
            let (lock, order) = (lock.clone(), order.clone());
            calls.push(
                call_now(Box::pin(async move {
                    let lease = lock.acquire().await.unwrap();
                    order.lock().unwrap().push(who);
                    lease.release().await.unwrap();
                }))
                .await,
            );
        }
        // Give `y`'s attempt the time to reach the server if it goes now (it waits for the
        // key's lock behind the release: a second waiting statement). Lined up, it does not
        // go before `x`'s attempt, which waits for the release: this bound then runs out.
        let _ =
            tokio::time::timeout(Duration::from_millis(300), until_lock_waits(&backend, 2)).await;
        blocker.commit().await.unwrap();
        released.await.unwrap().unwrap();
        for call in calls {
            call.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["x", "y"], "round {round}");
    }
}
