//! Mutual exclusion under load: many tasks, many rounds, in either grant order; never two
//! holders at once.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use super::{Harness, assert_no_residue, in_mode};
use crate::Mode;

async fn exclusion_rounds(h: &impl Harness, mode: Mode, fifo: bool) {
    const TASKS: usize = 8;
    const ITERATIONS: usize = 40;
    const ROUNDS: usize = 3;
    let engine = in_mode(h, mode);
    for round in 0..ROUNDS {
        let key = format!("exclusion-{round}");
        let inside = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(AtomicUsize::new(0));
        // Deliberately racy read-modify-write: only mutual exclusion keeps it exact.
        let counter = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (engine, key) = (engine.clone(), key.clone());
            let (inside, violations, counter) =
                (inside.clone(), violations.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ITERATIONS {
                    let lease = engine
                        .lock(&key)
                        .fifo(fifo)
                        .ttl(Duration::from_secs(10))
                        .acquire()
                        .await
                        .expect("acquire");
                    if inside.swap(true, Ordering::SeqCst) {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    let v = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(v + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                    lease.release().await.expect("release");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            violations.load(Ordering::SeqCst),
            0,
            "overlapping critical sections"
        );
        assert_eq!(counter.load(Ordering::SeqCst), (TASKS * ITERATIONS) as u64);
    }
    assert_no_residue(h).await;
}

pub async fn mutual_exclusion_many_tasks_many_iterations(h: &impl Harness, mode: Mode) {
    exclusion_rounds(h, mode, false).await;
}

pub async fn fifo_mutual_exclusion_many_tasks_many_iterations(h: &impl Harness, mode: Mode) {
    exclusion_rounds(h, mode, true).await;
}
