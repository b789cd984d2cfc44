//! A waiter's refresh that timed out is still on its way (the engine lets a statement land
//! rather than guess what it did): it may reach the database after the acquire has ended.
//! Landing then, it must not register the waiter's ticket again or take the key for a
//! caller that is gone. Here one of the waiter's two pooled connections is frozen (its
//! backend stopped with SIGSTOP) while the waiter refreshes every 250 ms: a refresh meets
//! it and times out, the wait runs out (its leave goes out on the other connection), the
//! holder releases, and only then does the frozen backend run the refresh.

use std::{process::Command, sync::Arc, time::Duration};

use tokio::time::Instant;
use tower_lock::engine::{LockEngine, LockError, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

async fn psql(server: &Arc<PostgresServer>, sql: String) -> String {
    let server = server.clone();
    tokio::task::spawn_blocking(move || server.psql(&sql))
        .await
        .unwrap()
}

fn signal(signal: &str, pid: &str) {
    let status = Command::new("kill").args([signal, pid]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_that_lands_after_its_wait_ran_out_leaves_nothing() {
    let server = Arc::new(
        tokio::task::spawn_blocking(PostgresServer::start)
            .await
            .unwrap(),
    );
    let builder = PostgresBackend::builder(server.url()).schema("late");
    builder.migrate().await.unwrap();
    let holder_node = LockEngine::new(builder.build().await.unwrap());
    // The waiter's node: two pooled connections, named so that the test finds them.
    let waiter_node = LockEngine::new(
        PostgresBackend::builder(format!("{}?application_name=late_waiter", server.url()))
            .schema("late")
            .pool_size(2)
            .command_timeout(Duration::from_millis(300))
            .build()
            .await
            .unwrap(),
    );
    let holder = holder_node
        .lock("k")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    // Both of the waiter node's pooled connections open.
    let (first, second) = (waiter_node.lock("k"), waiter_node.lock("k"));
    let (a, b) = tokio::join!(first.holder(), second.holder());
    a.unwrap();
    b.unwrap();
    let waiter = {
        let lock = waiter_node.lock("k").wait(Duration::from_millis(2000));
        tokio::spawn(async move { lock.acquire().await })
    };
    let give_up = Instant::now() + Duration::from_secs(10);
    while holder_node.lock("k").waiters().await.unwrap() != 1 {
        assert!(Instant::now() < give_up, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Freeze one pooled connection's backend (not the listener's): the pool hands its idle
    // connections out in turn, so one of the next refreshes meets it.
    let pid = psql(
        &server,
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'late_waiter' \
         AND query NOT LIKE 'LISTEN%' ORDER BY pid LIMIT 1"
            .to_owned(),
    )
    .await;
    assert!(!pid.is_empty(), "no pooled connection of the waiter's node");
    signal("-STOP", &pid);
    let waited = waiter.await.unwrap();
    assert!(
        matches!(waited, Err(LockError::TimedOut { .. })),
        "the wait runs out: {waited:?}"
    );
    holder.release().await.unwrap();
    signal("-CONT", &pid);
    // The frozen backend runs what it was sent, then sits idle.
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let state = psql(
            &server,
            format!("SELECT state FROM pg_stat_activity WHERE pid = {pid}"),
        )
        .await;
        if state == "idle" {
            break;
        }
        assert!(Instant::now() < give_up, "backend {pid} stays {state:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let lock = holder_node.lock("k");
    let left = lock.holder().await.unwrap();
    assert!(
        left.is_none(),
        "the key is held for a waiter that gave up: {left:?}"
    );
    assert_eq!(lock.waiters().await.unwrap(), 0, "a ticket is left");
}
