//! Arrival order through a server clock step back (libfaketime): FIFO and non-FIFO callers
//! on one key are served in the order they arrived, whatever the clock says when they
//! arrive, on the lock as on permits.
#![cfg(feature = "redis")]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::timeout;
use tower_lock::{Lease, LockEngine, LockError};
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine};
use tower_lock_test_support::serial;

use crate::vanished::{Kind, until_waiters};

async fn acquire(node: &LockEngine, kind: Kind, fifo: bool) -> Result<Lease, LockError> {
    let wait = Duration::from_secs(20);
    match kind {
        Kind::Lock => node.lock("k").fifo(fifo).wait(wait).acquire().await,
        Kind::Permit => {
            node.lock("k")
                .shared(1)
                .fifo(fifo)
                .wait(wait)
                .acquire()
                .await
        }
    }
}

/// Two FIFO waiters queue, the server clock steps back 5 s, a non-FIFO waiter queues last:
/// the grants follow arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_fifo_waiter_arriving_after_a_clock_step_back_is_served_after_earlier_fifo_waiters() {
    let _group = serial::group(module_path!()).await;
    for (kind, name) in [(Kind::Lock, "lock"), (Kind::Permit, "permits")] {
        let server = RedisServer::start_with_clock();
        let node = redis_engine(&server, "order", None).await;
        let holder = acquire(&node, kind, true).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for (i, (who, fifo)) in [("fifo 1", true), ("fifo 2", true), ("non-fifo 3", false)]
            .into_iter()
            .enumerate()
        {
            if i == 2 {
                tokio::task::block_in_place(|| server.set_clock(-5));
            }
            let (queued, order) = (node.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let lease = acquire(&queued, kind, fifo).await.unwrap();
                order.lock().unwrap().push(who);
                lease.release().await.unwrap();
            }));
            until_waiters(&node, kind, "k", i + 1).await;
        }
        holder.release().await.unwrap();
        for waiter in waiters {
            timeout(Duration::from_secs(20), waiter)
                .await
                .expect("every waiter is served")
                .unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["fifo 1", "fifo 2", "non-fifo 3"],
            "{name}: grants out of arrival order"
        );
    }
}
