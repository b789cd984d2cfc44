//! Tickets of waiters that died long ago (their process killed, their deadline past by the
//! server clock) never cost the key a claim period: a release skips them and hands the key
//! to the next live waiter, on the lock as on permits.
#![cfg(feature = "redis")]

use std::time::Duration;

use tokio::time::{Instant, timeout};
use tower_lock::{Lease, LockEngine, LockError};
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine, residue};
use tower_lock_test_support::serial;

use crate::vanished::{Kind, queue_and_kill, until_waiters};

/// The claim period of a hand-off with the default settings: what a dead ticket would cost.
const CLAIM: Duration = Duration::from_secs(3);

async fn acquire(node: &LockEngine, kind: Kind) -> Result<Lease, LockError> {
    let wait = Duration::from_secs(20);
    match kind {
        Kind::Lock => node.lock("k").fifo(true).wait(wait).acquire().await,
        Kind::Permit => {
            node.lock("k")
                .shared(1)
                .fifo(true)
                .wait(wait)
                .acquire()
                .await
        }
    }
}

/// A live waiter first in line, two waiters whose processes were killed (their tickets
/// dead by the server clock), then a live waiter: once the first is served and releases,
/// the last is granted at once, not a claim period per dead ticket later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_skips_the_tickets_of_waiters_that_died_long_ago() {
    let _group = serial::group(module_path!()).await;
    for (kind, name) in [(Kind::Lock, "lock"), (Kind::Permit, "permits")] {
        let server = RedisServer::start();
        let node = redis_engine(&server, "dead", None).await;
        let holder = acquire(&node, kind).await.unwrap();
        let first = tokio::spawn({
            let node = node.clone();
            async move { acquire(&node, kind).await }
        });
        until_waiters(&node, kind, "k", 1).await;
        queue_and_kill(&server, &node, "dead", "k", kind, "dead-1").await;
        queue_and_kill(&server, &node, "dead", "k", kind, "dead-2").await;
        let last = tokio::spawn({
            let node = node.clone();
            async move { acquire(&node, kind).await }
        });
        until_waiters(&node, kind, "k", 4).await;
        // The killed waiters' tickets lapse (no refresh): only the two live ones count.
        until_waiters(&node, kind, "k", 2).await;

        holder.release().await.unwrap();
        let first = timeout(Duration::from_secs(5), first)
            .await
            .expect("the first live waiter is served")
            .unwrap()
            .unwrap();
        let released = Instant::now();
        first.release().await.unwrap();
        let last = timeout(Duration::from_secs(20), last)
            .await
            .expect("the last live waiter is served")
            .unwrap()
            .unwrap();
        let waited = released.elapsed();
        assert!(
            waited < Duration::from_secs(1),
            "{name}: the live waiter behind two dead tickets waited {waited:?} (claim period {CLAIM:?})"
        );
        last.release().await.unwrap();
        let left = tokio::task::block_in_place(|| residue(&server, "dead"));
        assert!(left.is_empty(), "{name}: residue: {left:?}");
    }
}
