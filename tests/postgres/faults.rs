//! Faults short of a crash, each on a cluster of the test's own: the backend's connections
//! killed under it (`pg_terminate_backend`), and its listener killed.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use tower_lock::engine::{LockEngine, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

/// A cluster of the test's own and an engine on it (pool of `pool_size`).
async fn own(pool_size: u32) -> (Arc<PostgresServer>, LockEngine) {
    let server = Arc::new(
        tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .unwrap(),
    );
    let builder = PostgresBackend::builder(server.url())
        .schema("faults")
        .pool_size(pool_size);
    builder.migrate().await.unwrap();
    (server, LockEngine::new(builder.build().await.unwrap()))
}

async fn psql(server: &Arc<PostgresServer>, sql: &'static str) -> String {
    let server = server.clone();
    tokio::task::spawn_blocking(move || server.psql(sql))
        .await
        .unwrap()
}

/// Every pooled connection killed while idle: the calls whose repetition changes nothing
/// (acquire attempts, reads) meet the dead ones, are sent again on a fresh connection, and
/// none of them fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_pool_connections_fail_no_call_that_can_be_repeated() {
    let pool_size = 4;
    let (server, engine) = own(pool_size).await;
    let holder = engine.lock("k").acquire().await.unwrap();
    // Open every connection of the pool: calls at once.
    let lock = engine.lock("k");
    let reads = (0..pool_size * 2).map(|_| lock.holder());
    for read in futures_util::future::join_all(reads).await {
        read.unwrap();
    }
    let killed = psql(
        &server,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE usename = 'tower_lock' AND query NOT LIKE 'LISTEN%'",
    )
    .await;
    assert_ne!(killed, "0", "no connection was killed");
    for i in 0..pool_size * 2 {
        let seen = lock
            .holder()
            .await
            .unwrap_or_else(|e| panic!("read {i}: {e}"));
        assert_eq!(seen.map(|h| h.token), Some(holder.token().clone()));
        assert_eq!(lock.waiters().await.unwrap(), 0);
        let other = engine
            .lock(format!("other-{i}"))
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("acquire {i}: {e}"));
        // Released in the background when dropped (or left to its TTL on this throwaway
        // cluster).
        drop(other);
    }
    assert!(holder.owned().await.unwrap(), "the holder keeps its key");
}

/// The listener's connection killed: a waiter is still granted on its holder's release
/// (by the fallback timer, or by a listener already back), long before the holder's lease
/// would have run out, and the listener connects again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listener_delays_a_hand_off_by_no_more_than_the_fallback() {
    let (server, engine) = own(4).await;
    let holder = engine
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let killed = psql(
        &server,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE query LIKE 'LISTEN%'",
    )
    .await;
    assert_eq!(killed, "1", "the listener's connection");
    let waiter = {
        let lock = engine.lock("k").wait(Duration::from_secs(30));
        tokio::spawn(async move { lock.acquire().await })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock("k").waiters().await.unwrap() != 1 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    holder.release().await.unwrap();
    let next = waiter.await.unwrap().expect("the waiter is granted");
    assert!(
        next.waited() < Duration::from_secs(10),
        "waited {:?} for a key released at once",
        next.waited()
    );
    next.release().await.unwrap();
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let listening = psql(
            &server,
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'",
        )
        .await;
        if listening == "1" {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "the listener never connected again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
