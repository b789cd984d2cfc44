//! Fencing tokens: strictly increasing per key, across releases, expiries and re-entry.

use std::sync::{Arc, Mutex};

use tokio::time::sleep;

use crate::Mode;

use super::{Harness, assert_no_residue, in_mode};

pub async fn fences_strictly_increase_per_key(h: &impl Harness, mode: Mode) {
    let engine = in_mode(h, mode);
    let u = h.unit();
    let mut last = None;
    for _ in 0..20 {
        let lease = engine.lock("fence").acquire().await.unwrap();
        assert!(last.is_none_or(|l| lease.fence() > l));
        last = Some(lease.fence());
        lease.release().await.unwrap();
    }
    // Across an expiry: the next holder's fence is higher than the stale holder's.
    let stale = engine
        .lock("fence")
        .ttl(u * 2)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    sleep(u * 4).await;
    let next = engine.lock("fence").try_acquire().await.unwrap();
    assert!(next.fence() > stale.fence());
    next.release().await.unwrap();
    drop(stale);
    // Under contention, in grant order.
    let fences = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let (engine, fences) = (engine.clone(), fences.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let lease = engine.lock("fence").acquire().await.unwrap();
                    fences.lock().unwrap().push(lease.fence());
                    lease.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let fences = fences.lock().unwrap().clone();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert_no_residue(h).await;
}
