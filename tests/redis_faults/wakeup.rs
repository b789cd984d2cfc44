//! Wake-ups on one server: every hand-off reaches its waiter by message, FIFO or not, on
//! the releasing node and on another one. A waiter that found its grant only on its
//! fallback timer (250 ms later) is a failure here, even though it was served: the
//! backend logs each such grant, and the test counts them.
//!
//! The server is the test's own; the runtime is multi-threaded.
#![cfg(feature = "redis")]

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tower_lock::LockEngine;
use tower_lock_test_support::fallbacks::Fallbacks;
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine};
use tower_lock_test_support::serial;

const WORKERS_PER_NODE: usize = 2;
const CYCLES: usize = 15;

/// Server-side `PUBLISH` calls so far: one per hand-off.
fn publishes(server: &RedisServer) -> u64 {
    let stats = server.cli(["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a call count"))
}

/// Workers on two nodes cycle one key; returns how many grants were made.
async fn cycle(nodes: &[LockEngine], key: &str, fifo: bool) -> usize {
    let grants = Arc::new(AtomicUsize::new(0));
    let holders = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for node in nodes {
        for _ in 0..WORKERS_PER_NODE {
            let (node, key) = (node.clone(), key.to_owned());
            let (grants, holders) = (grants.clone(), holders.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..CYCLES {
                    let lease = node
                        .lock(&key)
                        .fifo(fifo)
                        .wait(Duration::from_secs(10))
                        .acquire()
                        .await
                        .expect("every waiter is served");
                    assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    grants.fetch_add(1, Ordering::SeqCst);
                    // A critical section long enough for the others to queue behind it.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    lease.release().await.expect("released");
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("worker");
    }
    grants.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hand_off_arrives_by_message() {
    let _group = serial::group(module_path!()).await;
    let fallbacks = Fallbacks::install();
    let server = RedisServer::start();
    let nodes = [
        redis_engine(&server, "wake", None).await,
        redis_engine(&server, "wake", None).await,
    ];
    for fifo in [true, false] {
        let key = format!("k-{fifo}");
        let (timer_before, published_before) = (fallbacks.count(), publishes(&server));
        let grants = cycle(&nodes, &key, fifo).await;
        assert_eq!(grants, 2 * WORKERS_PER_NODE * CYCLES);
        let handed_off = publishes(&server) - published_before;
        // Not vacuous: most grants were hand-offs to a queued waiter.
        assert!(
            handed_off as usize >= grants / 2,
            "fifo {fifo}: only {handed_off} of {grants} grants were hand-offs"
        );
        assert_eq!(
            fallbacks.count() - timer_before,
            0,
            "fifo {fifo}: waiters served by the fallback timer, not by their grant message"
        );
    }
}
