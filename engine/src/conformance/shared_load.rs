//! The shared-only behaviours under load: many tasks, limits N and 1 and the key's lock
//! mixed, never more than N holders nor anyone beside a holder alone, every grant its own
//! fence.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use super::{Harness, assert_no_residue};
use crate::{Fence, Mode};

async fn shared_rounds(h: &impl Harness, fifo: bool) {
    const TASKS: usize = 12;
    const ITERATIONS: usize = 25;
    const N: usize = 3;
    let engine = h.engine();
    let key = format!("shared-load-{fifo}");
    // Holders inside their critical section now, by kind. Each is counted from after its
    // grant to before its release, so any overlap seen here is a real one.
    let shared = Arc::new(AtomicUsize::new(0));
    let alone = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(Mutex::new(Vec::new()));
    // Deliberately racy read-modify-write by lone holders: only their exclusion keeps it
    // exact.
    let counter = Arc::new(AtomicU64::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (engine, key) = (engine.clone(), key.clone());
        let (shared, lone, violations, counter, fences) = (
            shared.clone(),
            alone.clone(),
            violations.clone(),
            counter.clone(),
            fences.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut writes = 0;
            let mut last: Option<Fence> = None;
            for i in 0..ITERATIONS {
                let writer = (t + i) % 5 == 0;
                // Writers alternate between the key's lock and a shared lease of limit 1:
                // both hold alone.
                let mode = match (writer, (t + i) % 2) {
                    (false, _) => Mode::Shared { limit: N as u32 },
                    (true, 0) => Mode::Exclusive,
                    (true, _) => Mode::Shared { limit: 1 },
                };
                let lease = engine
                    .lock(&key)
                    .in_mode(mode)
                    .fifo(fifo)
                    .ttl(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("acquire");
                // Each task sees its fences rise, shared or alone.
                assert!(last.is_none_or(|l| lease.fence() > l));
                last = Some(lease.fence());
                fences.lock().unwrap().push(lease.fence());
                if writer {
                    let writers = lone.fetch_add(1, Ordering::SeqCst) + 1;
                    let readers = shared.load(Ordering::SeqCst);
                    if writers > 1 || readers > 0 {
                        violations.lock().unwrap().push((writers, readers));
                    }
                    let v = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(v + 1, Ordering::SeqCst);
                    writes += 1;
                    lone.fetch_sub(1, Ordering::SeqCst);
                } else {
                    let readers = shared.fetch_add(1, Ordering::SeqCst) + 1;
                    let writers = lone.load(Ordering::SeqCst);
                    if readers > N || writers > 0 {
                        violations.lock().unwrap().push((writers, readers));
                    }
                    tokio::task::yield_now().await;
                    tokio::task::yield_now().await;
                    shared.fetch_sub(1, Ordering::SeqCst);
                }
                lease.release().await.expect("release");
            }
            writes
        }));
    }
    let mut writes = 0;
    for t in tasks {
        writes += t.await.unwrap();
    }
    let violations = violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "(alone, shared) holders at once: {violations:?}"
    );
    assert_eq!(counter.load(Ordering::SeqCst), writes);
    let fences = fences.lock().unwrap().clone();
    let distinct: HashSet<Fence> = fences.iter().copied().collect();
    assert_eq!(distinct.len(), fences.len(), "two grants shared a fence");
    assert_no_residue(h).await;
}

/// Many tasks on a multi-threaded runtime, limits N and 1 and the key's lock mixed: never
/// more than N shared holders, never a holder alone beside anyone, every grant its own
/// fence.
pub async fn shared_leases_never_exceed_n_nor_share_a_lone_holder(h: &impl Harness) {
    shared_rounds(h, false).await;
}

/// The same in FIFO mode.
pub async fn fifo_shared_leases_never_exceed_n_nor_share_a_lone_holder(h: &impl Harness) {
    shared_rounds(h, true).await;
}
