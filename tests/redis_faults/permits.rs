//! Permits on Redis: N holders per key, or one exclusive holder alone, under faults. What
//! must hold:
//! - a freed permit goes to the next waiter by message (never found by the fallback timer);
//! - once an exclusive request waits, later shared ones queue behind it;
//! - a holder that crashed (its lease no longer renewed) frees its permit once its TTL
//!   runs out, and a waiter is granted it then, not a lease TTL later;
//! - with Redis paused mid-run, never more than N hold at once, nor anyone beside an
//!   exclusive holder;
//! - nothing is left behind once nobody holds or waits, the fence tombstones aside (and
//!   they keep only the last fence, with a TTL).
//!
//! Each test owns its redis-server; the runtimes are multi-threaded.
#![cfg(feature = "redis")]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::{Instant, timeout};
use tower_lock::{LockEngine, LockError, engine::Permits};
use tower_lock_test_support::fallbacks::Fallbacks;
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine, residue};
use tower_lock_test_support::serial;

async fn engine(server: &RedisServer, prefix: &str) -> LockEngine {
    redis_engine(server, prefix, Some(Duration::from_millis(300))).await
}

/// Wait until `n` callers wait for a permit of `permits`' key (backend state, no event).
async fn until_waiters(permits: &Permits, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while permits.waiters().await.unwrap() != n {
        assert!(Instant::now() < give_up, "never saw {n} permit waiters");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Wait until nothing but fence tombstones is left under `prefix`, then check that every
/// permit tombstone keeps only the last fence, with a TTL.
async fn until_no_residue(server: &RedisServer, prefix: &str) {
    // Dropped leases and cancelled waiters clean up in spawned tasks.
    let give_up = Instant::now() + Duration::from_secs(3);
    loop {
        let left = tokio::task::block_in_place(|| residue(server, prefix));
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < give_up, "residue: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tombstones = tokio::task::block_in_place(|| server.scan(&format!("{prefix}:*")));
    for key in tombstones.iter().filter(|k| k.contains("}:pfence:")) {
        let fields = tokio::task::block_in_place(|| server.cli(["HKEYS", key]));
        assert_eq!(fields, "fence", "{key} keeps holders: {fields:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_permits_admit_n_and_a_release_hands_one_to_the_next_waiter_by_message() {
    let _group = serial::group(module_path!()).await;
    let fallbacks = Fallbacks::install();
    let server = RedisServer::start();
    let (a, b) = (
        engine(&server, "handoff").await,
        engine(&server, "handoff").await,
    );
    let permits = a.permits("k", 2).ttl(Duration::from_secs(30));
    let first = permits.acquire().await.unwrap();
    let second = permits.acquire().await.unwrap();
    assert!(second.fence() > first.fence());
    match permits.try_acquire().await {
        Err(LockError::Busy { retry_after }) => {
            let left = retry_after.expect("the first holder's remaining TTL");
            assert!(left > Duration::from_secs(25) && left <= Duration::from_secs(30));
        }
        other => panic!("a third permit of two: {other:?}"),
    }
    assert_eq!(permits.holders().await.unwrap().len(), 2);

    let mut held = vec![first, second];
    let mut last_fence = held[1].fence();
    for _ in 0..6 {
        // A waiter on the other node, granted by a release on this one.
        let other = b.permits("k", 2).wait(Duration::from_secs(10));
        let waiter = tokio::spawn(async move { other.acquire().await });
        until_waiters(&permits, 1).await;
        let before = fallbacks.count_under("handoff");
        held.remove(0).release().await.unwrap();
        let granted = timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter is granted the freed permit")
            .unwrap()
            .unwrap();
        assert_eq!(
            fallbacks.count_under("handoff"),
            before,
            "the grant was found by the fallback timer, not by its message"
        );
        assert!(granted.fence() > last_fence);
        last_fence = granted.fence();
        held.push(granted);
        assert_eq!(permits.holders().await.unwrap().len(), 2);
    }
    for lease in held {
        lease.release().await.unwrap();
    }
    until_no_residue(&server, "handoff").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_exclusive_request_holds_back_later_shared_ones() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "writer").await;
    let doc = engine
        .permits("doc", u32::MAX)
        .wait(Duration::from_secs(10));
    let reader = doc.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let (doc, order) = (doc.clone().exclusive(), order.clone());
        tokio::spawn(async move {
            let lease = doc.acquire().await.unwrap();
            order.lock().unwrap().push("writer");
            lease
        })
    };
    until_waiters(&doc, 1).await;
    // Readers still fit beside the reader, but a writer waits: they queue behind it.
    assert!(matches!(
        doc.try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    let late_reader = {
        let (doc, order) = (doc.clone(), order.clone());
        tokio::spawn(async move {
            let lease = doc.acquire().await.unwrap();
            order.lock().unwrap().push("reader");
            lease
        })
    };
    until_waiters(&doc, 2).await;
    reader.release().await.unwrap();
    let writer = timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer is granted once the reader leaves")
        .unwrap();
    let holders = doc.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert!(holders[0].exclusive);
    assert_eq!(
        doc.waiters().await.unwrap(),
        1,
        "the late reader still waits"
    );
    let writer_fence = writer.fence();
    writer.release().await.unwrap();
    let late_reader = timeout(Duration::from_secs(5), late_reader)
        .await
        .expect("the late reader is granted after the writer")
        .unwrap();
    assert_eq!(*order.lock().unwrap(), ["writer", "reader"]);
    assert!(late_reader.fence() > writer_fence);
    late_reader.release().await.unwrap();
    until_no_residue(&server, "writer").await;
}

/// One of two holders crashes (its lease neither renewed nor released) while the other
/// lives on, so the holders' key stays: the crashed permit must be dropped by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_frees_after_its_ttl_and_goes_to_a_waiter() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    const TTL: Duration = Duration::from_millis(1500);
    let survivor = engine(&server, "crash").await;
    let permits = survivor.permits("k", 2).ttl(Duration::from_secs(30));
    let live = permits.acquire().await.unwrap();
    // The crashed node.
    let crashed = engine(&server, "crash").await;
    let started = Instant::now();
    let lease = crashed
        .permits("k", 2)
        .ttl(TTL)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let stale_fence = lease.fence();
    std::mem::forget(lease);
    drop(crashed);

    let granted = permits
        .clone()
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the crashed permit frees");
    let after = started.elapsed();
    assert!(
        after >= TTL,
        "granted {after:?} after the crash, before its TTL"
    );
    // The fallback retry notices the expiry: at most one fallback period late (250 ms),
    // with room for a loaded machine.
    assert!(
        after < TTL + Duration::from_secs(1),
        "granted {after:?} after the crash"
    );
    assert!(granted.fence() > stale_fence);
    assert_eq!(permits.holders().await.unwrap().len(), 2);
    granted.release().await.unwrap();
    live.release().await.unwrap();
    until_no_residue(&server, "crash").await;
}

/// Shared and exclusive holders on three nodes, counted as they hold: never more than
/// `N` shared, never anyone beside an exclusive one, while Redis is paused mid-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_paused_mid_run_never_lets_more_than_n_hold() {
    let _group = serial::group(module_path!()).await;
    const N: usize = 3;
    let server = RedisServer::start();
    let nodes = [
        engine(&server, "paused").await,
        engine(&server, "paused").await,
        engine(&server, "paused").await,
    ];
    let shared = Arc::new(AtomicUsize::new(0));
    let exclusive = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..12 {
        let node = nodes[w % 3].clone();
        let (shared, exclusive, grants, stop) = (
            shared.clone(),
            exclusive.clone(),
            grants.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let alone = w % 6 == 0;
            let mut permits = node
                .permits("k", N as u32)
                .fifo(w % 2 == 0)
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(20));
            if alone {
                permits = permits.exclusive();
            }
            while !stop.load(Ordering::SeqCst) {
                // A failure (the server paused) is retried; nothing may be granted wrongly.
                let Ok(lease) = permits.acquire().await else {
                    continue;
                };
                if alone {
                    assert_eq!(exclusive.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(shared.load(Ordering::SeqCst), 0, "a writer beside readers");
                } else {
                    let now = shared.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= N, "{now} shared holders of {N}");
                    assert_eq!(
                        exclusive.load(Ordering::SeqCst),
                        0,
                        "a reader beside a writer"
                    );
                }
                grants.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                if alone {
                    exclusive.fetch_sub(1, Ordering::SeqCst);
                } else {
                    shared.fetch_sub(1, Ordering::SeqCst);
                }
                let _ = lease.release().await;
            }
        }));
    }
    let until_grants = |n: usize| {
        let grants = grants.clone();
        async move {
            let give_up = Instant::now() + Duration::from_secs(30);
            while grants.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < give_up, "only {grants:?} grants");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    until_grants(100).await;
    tokio::task::block_in_place(|| server.cli(["CLIENT", "PAUSE", "800", "ALL"]));
    let paused_at = grants.load(Ordering::SeqCst);
    tokio::task::block_in_place(|| server.wait_ready());
    // Work goes on after the pause.
    until_grants(paused_at + 100).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("no worker saw a violation");
    }
    until_no_residue(&server, "paused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_timeouts_and_cancellations_leave_nothing_behind() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "residue").await;
    let mut tasks = Vec::new();
    for i in 0..30 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut permits = engine
                .permits(format!("k{}", i % 3), 2)
                .fifo(i % 2 == 0)
                .ttl(Duration::from_secs(5));
            if i % 5 == 0 {
                permits = permits.exclusive();
            }
            match i % 3 {
                // Hold briefly, release explicitly.
                0 => {
                    let lease = permits.acquire().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    lease.release().await.unwrap();
                }
                // Give up waiting quickly (may also win at once, then drop).
                1 => {
                    let _ = permits.wait(Duration::from_millis(3)).acquire().await;
                }
                // Dropped mid-wait, or dropped holding.
                _ => {
                    let _ = timeout(Duration::from_millis(4), permits.acquire()).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    until_no_residue(&server, "residue").await;
    for k in 0..3 {
        let permits = engine.permits(format!("k{k}"), 2);
        assert_eq!(permits.waiters().await.unwrap(), 0);
        assert!(permits.holders().await.unwrap().is_empty());
    }
}
