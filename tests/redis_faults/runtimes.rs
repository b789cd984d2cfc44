//! The Redis engine owns its I/O: an engine built on one runtime keeps serving every other
//! runtime when the first one blocks (a blocking call in its only worker: a blocking
//! handler on an actix worker, a `block_on` inside a handler) or is shut down (a
//! short-lived runtime that built the engine). Calls, leases and wake-ups from a healthy
//! runtime must not notice.
//!
//! Each test builds its runtimes by hand (runtime A that built the engine, runtime B that
//! uses it), so the tests are plain `#[test]`s. Each owns its redis-server.
#![cfg(feature = "redis")]

use std::{sync::mpsc, time::Duration};

use tokio::{
    runtime::{Builder, Runtime},
    time::{Instant, timeout},
};
use tower_lock::LockEngine;
use tower_lock_test_support::fallbacks::Fallbacks;
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine};
use tower_lock_test_support::serial;

/// The command timeout of these engines: a call stuck behind the blocked runtime fails
/// after it, so "promptly" means well within it.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);

fn runtime(workers: usize) -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// Runtime A with its only worker blocked until this is dropped.
struct Blocked {
    runtime: Option<Runtime>,
    unblock: Option<mpsc::Sender<()>>,
}

impl Blocked {
    /// Block `runtime`'s only worker in a blocking call; returns once the worker is in it.
    fn block(runtime: Runtime) -> Self {
        let (unblock, blocked_until) = mpsc::channel::<()>();
        let (entered, inside) = mpsc::channel::<()>();
        runtime.spawn(async move {
            entered.send(()).unwrap();
            // A blocking call inside the worker: the runtime runs nothing else meanwhile.
            let _ = blocked_until.recv();
        });
        inside
            .recv()
            .expect("runtime A's worker runs the blocking task");
        Self {
            runtime: Some(runtime),
            unblock: Some(unblock),
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        drop(self.unblock.take());
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// An engine built on runtime A, used there for everything that creates connections and
/// tasks (commands, a lease, a wait that starts the wake-up subscriber); then A's only
/// worker is blocked.
fn engine_on_blocked_runtime(server: &RedisServer, prefix: &str) -> (LockEngine, Blocked) {
    let a = runtime(1);
    let engine = a.block_on(async {
        let engine = redis_engine(server, prefix, Some(COMMAND_TIMEOUT)).await;
        // Several calls at once, so the pool opens more than one connection on A.
        let leases = warm_pool(&engine).await;
        let holder = leases.into_iter().next().unwrap();
        // A waiter makes the engine subscribe to wake-ups (the subscriber task starts here).
        let waiter = {
            let engine = engine.clone();
            tokio::spawn(async move {
                engine
                    .lock("warm-0")
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await
            })
        };
        let give_up = Instant::now() + Duration::from_secs(5);
        while engine.lock("warm-0").waiters().await.unwrap() == 0 {
            assert!(Instant::now() < give_up, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        holder.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
        engine
    });
    (engine, Blocked::block(a))
}

/// Four leases taken at once (on four keys), so the pool holds several connections.
async fn warm_pool(engine: &LockEngine) -> Vec<tower_lock::Lease> {
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move { engine.lock(format!("warm-{i}")).acquire().await })
        })
        .collect();
    let mut leases = Vec::new();
    for t in tasks {
        leases.push(t.await.unwrap().unwrap());
    }
    // Keep the one on warm-0; the others go back.
    for lease in leases.drain(1..).collect::<Vec<_>>() {
        lease.release().await.unwrap();
    }
    leases
}

#[test]
fn a_blocked_runtime_does_not_delay_an_acquire_from_another() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start();
    let (engine, _blocked) = engine_on_blocked_runtime(&server, "blocked-acquire");
    let b = runtime(2);
    b.block_on(async {
        let started = Instant::now();
        for i in 0..8 {
            let lease = engine
                .lock(format!("b-{i}"))
                .try_acquire()
                .await
                .expect("an acquire from runtime B succeeds while A is blocked");
            lease.release().await.unwrap();
        }
        let took = started.elapsed();
        assert!(
            took < COMMAND_TIMEOUT,
            "8 acquires and releases from B took {took:?} while A was blocked"
        );
    });
}

#[test]
fn a_blocked_runtime_does_not_lose_a_lease_taken_on_another() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start();
    let a = runtime(1);
    let engine = a.block_on(redis_engine(
        &server,
        "blocked-lease",
        Some(COMMAND_TIMEOUT),
    ));
    let b = runtime(2);
    b.block_on(async {
        // Taken on B; its connections came from A, where the engine was built.
        let lease = engine
            .lock("held")
            .ttl(Duration::from_millis(600))
            .acquire()
            .await
            .unwrap();
        let _blocked = Blocked::block(a);
        // Renewals every 200 ms keep it: after three TTLs it is still held, and still ours.
        assert!(
            timeout(Duration::from_millis(1800), lease.lost())
                .await
                .is_err(),
            "the lease was lost while runtime A was blocked"
        );
        assert!(lease.owned().await.unwrap());
        lease.release().await.unwrap();
    });
}

#[test]
fn a_blocked_runtime_does_not_turn_hand_offs_into_fallback_grants() {
    let _group = serial::group_blocking(module_path!());
    let fallbacks = Fallbacks::install();
    let server = RedisServer::start();
    let (engine, _blocked) = engine_on_blocked_runtime(&server, "blocked-wake");
    let b = runtime(2);
    b.block_on(
        fallbacks.lost_none_while("while runtime A was blocked", async {
            for round in 0..3 {
                let holder = engine.lock("k").acquire().await.unwrap();
                let waiter = {
                    let engine = engine.clone();
                    tokio::spawn(async move {
                        engine
                            .lock("k")
                            .wait(Duration::from_secs(5))
                            .acquire()
                            .await
                    })
                };
                let give_up = Instant::now() + Duration::from_secs(5);
                while engine.lock("k").waiters().await.unwrap() == 0 {
                    assert!(Instant::now() < give_up, "round {round}: never queued");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                holder.release().await.unwrap();
                let lease = waiter.await.unwrap().expect("the waiter is handed the key");
                lease.release().await.unwrap();
            }
        }),
    );
}

#[test]
fn an_engine_built_in_a_runtime_that_shut_down_works_from_another() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start();
    let engine = {
        let short_lived = Builder::new_current_thread().enable_all().build().unwrap();
        let engine =
            short_lived.block_on(redis_engine(&server, "short-lived", Some(COMMAND_TIMEOUT)));
        // Used there once, so it holds connections made there.
        short_lived.block_on(async {
            engine
                .lock("k")
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        });
        engine
        // The runtime shuts down here, with every task it ran.
    };
    let b = runtime(2);
    b.block_on(async {
        let lease = engine
            .lock("k")
            .try_acquire()
            .await
            .expect("the engine works from another runtime");
        lease.release().await.unwrap();
        // And waiting works too (the subscriber, started after the shutdown).
        let holder = engine.lock("k").acquire().await.unwrap();
        let waiter = {
            let engine = engine.clone();
            tokio::spawn(async move {
                engine
                    .lock("k")
                    .wait(Duration::from_secs(5))
                    .acquire()
                    .await
            })
        };
        let give_up = Instant::now() + Duration::from_secs(5);
        while engine.lock("k").waiters().await.unwrap() == 0 {
            assert!(Instant::now() < give_up, "never queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        holder.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
    });
}

/// Calls from a user's runtime go out on a connection of that runtime (no hop to the
/// engine's thread and back), and a runtime that went away leaves no connection behind:
/// its connection closes with it, and the engine keeps working from another runtime.
#[test]
fn a_runtimes_calls_use_its_own_connection_which_goes_with_it() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start();
    // Connections of commands (`normal`), the counting `redis-cli` itself included.
    let clients = || {
        server
            .cli(["CLIENT", "LIST", "TYPE", "normal"])
            .lines()
            .count()
    };
    let b = runtime(1);
    let engine = b.block_on(redis_engine(&server, "own", Some(COMMAND_TIMEOUT)));
    let cycle = |engine: &LockEngine| {
        let engine = engine.clone();
        async move {
            let lease = engine.lock("k").try_acquire().await.unwrap();
            lease.release().await.unwrap();
        }
    };
    b.block_on(cycle(&engine));
    let with_b = clients();
    let a = runtime(1);
    a.block_on(cycle(&engine));
    assert_eq!(
        clients(),
        with_b + 1,
        "runtime A's calls have a connection of A's own"
    );
    a.block_on(cycle(&engine));
    assert_eq!(clients(), with_b + 1, "and keep using it");
    drop(a);
    let give_up = std::time::Instant::now() + Duration::from_secs(5);
    while clients() != with_b {
        assert!(
            std::time::Instant::now() < give_up,
            "runtime A shut down 5 s ago and its connection is still open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    b.block_on(cycle(&engine));
    assert_eq!(clients(), with_b);
}

/// The key is free again for another node within `within` (a waiting acquire from it is
/// granted), though the lease that held it had a 30 s TTL.
fn freed_within(b: &Runtime, other: &LockEngine, key: &str, within: Duration, what: &str) {
    b.block_on(async {
        let lease = other
            .lock(key)
            .wait(within)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{what}: the key is still held {within:?} later ({e})"));
        lease.release().await.unwrap();
    });
}

/// A lease dropped (or released through `runtime::detach`) in a runtime that shuts down
/// right after is released all the same: the release must not ride a connection whose
/// driver that runtime owned.
#[test]
fn a_release_on_drop_lands_when_its_runtime_shuts_down_right_after() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start();
    let b = runtime(2);
    let other = b.block_on(redis_engine(
        &server,
        "drop-shutdown",
        Some(COMMAND_TIMEOUT),
    ));
    let engine = b.block_on(redis_engine(
        &server,
        "drop-shutdown",
        Some(COMMAND_TIMEOUT),
    ));
    for round in 0..6 {
        let detach = round % 2 == 1;
        let a = Builder::new_current_thread().enable_all().build().unwrap();
        a.block_on(async {
            let lease = engine
                .lock("k")
                .ttl(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            if detach {
                tower_lock::engine::runtime::detach(async move {
                    let _ = lease.release().await;
                });
            } else {
                drop(lease);
            }
        });
        // The runtime shuts down with the release just begun.
        drop(a);
        let how = if detach { "detach(release())" } else { "drop" };
        freed_within(
            &b,
            &other,
            "k",
            Duration::from_secs(2),
            &format!("round {round}, released by {how} before its runtime shut down"),
        );
    }
}

/// A lease dropped on a runtime whose worker then blocks is released all the same: its
/// release must not wait for that runtime.
#[test]
fn a_release_on_drop_does_not_wait_for_a_blocked_runtime() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start();
    let b = runtime(2);
    let other = b.block_on(redis_engine(&server, "drop-blocked", Some(COMMAND_TIMEOUT)));
    let engine = b.block_on(redis_engine(&server, "drop-blocked", Some(COMMAND_TIMEOUT)));
    for round in 0..3 {
        let a = runtime(1);
        // Taken on A (its calls, and the connection they use, are A's).
        let lease = a.block_on(async {
            engine
                .lock("k")
                .ttl(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap()
        });
        // A's only worker blocks (a handler's synchronous stretch); the lease is dropped
        // from A's context meanwhile.
        let (unblock, blocked_until) = mpsc::channel::<()>();
        let (entered, inside) = mpsc::channel::<()>();
        a.spawn(async move {
            entered.send(()).unwrap();
            let _ = blocked_until.recv();
        });
        inside.recv().unwrap();
        a.block_on(async move { drop(lease) });
        freed_within(
            &b,
            &other,
            "k",
            Duration::from_secs(1),
            &format!("round {round}, dropped while its runtime's worker blocked"),
        );
        drop(unblock);
        a.shutdown_background();
    }
}

/// A call from a tokio runtime built without the I/O driver, or without any driver, works
/// (or fails with an error): the engine never panics for its caller's runtime.
#[test]
fn a_call_from_a_runtime_without_io_or_timers_works() {
    let _group = serial::group_blocking(module_path!());
    let server = RedisServer::start();
    let b = runtime(2);
    let engine = b.block_on(redis_engine(&server, "no-drivers", Some(COMMAND_TIMEOUT)));
    let timers_only = Builder::new_current_thread().enable_time().build().unwrap();
    let none = Builder::new_current_thread().build().unwrap();
    let multi_none = Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap();
    for (name, rt) in [
        ("timers only", &timers_only),
        ("no drivers", &none),
        ("multi-thread, no drivers", &multi_none),
    ] {
        let engine = engine.clone();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(async {
                for i in 0..3 {
                    let lease = engine
                        .lock(format!("k{i}"))
                        .try_acquire()
                        .await
                        .unwrap_or_else(|e| panic!("an acquire failed: {e}"));
                    lease.release().await.unwrap();
                }
                // A wait for a held key, handed over by a release.
                let holder = engine.lock("k0").acquire().await.unwrap();
                let lock = engine.lock("k0");
                let lock = lock.wait(Duration::from_secs(2));
                let waiter = lock.acquire();
                let release = async {
                    holder.release().await.unwrap();
                };
                let (lease, ()) = tokio::join!(waiter, release);
                let lease = lease.unwrap_or_else(|e| panic!("a wait failed: {e}"));
                drop(lease);
            })
        }));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!("a call from a runtime with {name} panicked: {message}");
        }
    }
}
