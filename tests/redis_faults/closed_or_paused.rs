//! Connections the server closed while idle, and calls the server holds back
//! (`CLIENT PAUSE WRITE`, what `FAILOVER` does): a call handed to a connection the server
//! had closed goes again on a fresh one, even when its runtime was too busy to read the
//! close first; and a release the server queued is not discarded by the engine closing
//! its socket.

use std::{collections::HashSet, time::Duration};

use tokio::runtime::{Builder, Runtime};
use tower_lock::LockEngine;
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine};
use tower_lock_test_support::serial;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);

fn runtime(workers: usize) -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// The ids of the server's command connections (the asking `redis-cli` left out).
fn command_connections(server: &RedisServer) -> HashSet<String> {
    server
        .cli(["CLIENT", "LIST", "TYPE", "normal"])
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .filter_map(|l| l.split(' ').next().map(str::to_owned))
        .collect()
}

/// Block the calling thread (a runtime busy in a synchronous stretch) until the server
/// has closed every connection in `ids` (its idle `timeout`).
fn busy_until_closed(server: &RedisServer, ids: &HashSet<String>) {
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while !command_connections(server).is_disjoint(ids) {
        assert!(
            std::time::Instant::now() < give_up,
            "the server never closed the idle connection"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's idle `timeout` closes a runtime's connection while that runtime is busy
/// (its connection's driver cannot read the close); the runtime's next acquire, and its
/// next release, go again on a fresh connection instead of failing with `broken pipe`.
#[test]
fn a_call_on_a_connection_closed_while_its_runtime_was_busy_goes_again() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start_with(["--timeout", "1"]);
    let b = runtime(2);
    let engine = b.block_on(redis_engine(&server, "closed-busy", Some(COMMAND_TIMEOUT)));
    let other = b.block_on(redis_engine(&server, "closed-busy", Some(COMMAND_TIMEOUT)));
    for round in 0..2 {
        let a = Builder::new_current_thread().enable_all().build().unwrap();
        let before = command_connections(&server);
        a.block_on(cycle(&engine));
        let ids: HashSet<String> = command_connections(&server)
            .difference(&before)
            .cloned()
            .collect();
        assert!(!ids.is_empty(), "runtime A's calls opened a connection");
        a.block_on(async {
            // The whole wait is synchronous: A's driver cannot run meanwhile.
            busy_until_closed(&server, &ids);
            let lease = engine
                .lock("k")
                .ttl(Duration::from_secs(30))
                .try_acquire()
                .await
                .unwrap_or_else(|e| {
                    panic!("round {round}: an acquire after an idle close failed: {e}")
                });
            let ids: HashSet<String> = command_connections(&server)
                .difference(&before)
                .cloned()
                .collect();
            busy_until_closed(&server, &ids);
            lease.release().await.unwrap_or_else(|e| {
                panic!("round {round}: a release after an idle close failed: {e}")
            });
        });
        b.block_on(async {
            let lease = other
                .lock("k")
                .try_acquire()
                .await
                .unwrap_or_else(|e| panic!("round {round}: the key is still held: {e}"));
            lease.release().await.unwrap();
        });
    }
}

async fn cycle(engine: &LockEngine) {
    let lease = engine.lock("warm").try_acquire().await.unwrap();
    lease.release().await.unwrap();
}

/// A release the server holds back behind `CLIENT PAUSE WRITE` outlasts its command
/// timeout; the engine's next calls must not close the socket it waits on, so the server
/// runs it when the pause ends, and the key is free long before its TTL.
#[test]
fn a_release_held_behind_a_write_pause_lands_when_the_pause_ends() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start();
    let b = runtime(2);
    let engine = b.block_on(redis_engine(&server, "paused", Some(COMMAND_TIMEOUT)));
    let other = b.block_on(redis_engine(&server, "paused", Some(COMMAND_TIMEOUT)));
    for round in 0..2 {
        let lease = b.block_on(async {
            engine
                .lock("k")
                .ttl(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap()
        });
        server.cli(["CLIENT", "PAUSE", "2000", "WRITE"]);
        let paused = std::time::Instant::now();
        // Released on the engine's own runtime (where drops and detached releases run).
        let engine2 = engine.clone();
        let released = b.block_on(async move {
            tower_lock::engine::runtime::handle()
                .spawn(async move {
                    let released = lease.release().await;
                    // The engine's next call on its own runtime checks a connection out.
                    let _ = engine2.lock("read").waiters().await;
                    released
                })
                .await
                .unwrap()
        });
        assert!(
            released.is_err(),
            "round {round}: the release answered during the pause"
        );
        assert!(
            paused.elapsed() < Duration::from_millis(2000),
            "round {round}: the calls outlasted the pause, which the test needs them not to"
        );
        // A write from `redis-cli` waits out the pause.
        server.cli(["SET", "paused:probe", "1"]);
        b.block_on(async {
            let lease = other
                .lock("k")
                .wait(Duration::from_secs(1))
                .acquire()
                .await
                .unwrap_or_else(|e| {
                    panic!("round {round}: the key is still held 1 s after the pause ended (TTL 30 s): {e}")
                });
            lease.release().await.unwrap();
        });
    }
}
