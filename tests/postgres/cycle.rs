//! The uncontended cycle on Postgres: what an acquire and a release cost, measured (printed,
//! never asserted: the benches compare figures, a test only checks what they mean).

use std::time::{Duration, Instant};

use tower_lock::engine::{
    LockEngine,
    postgres::sqlx::{self, Executor},
};
use tower_lock_test_support::postgres::PostgresServer;

use crate::harness::backend;

/// One acquire and one release per cycle, one statement each, on the lock and on shared
/// leases: run with `--nocapture` to see
/// the mean cycle time on this machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_cycles_take_one_statement_each_way_and_fences_rise() {
    let url = tokio::task::spawn_blocking(|| PostgresServer::shared().url())
        .await
        .unwrap();
    let backend = backend(url, None, "cycle").await;
    let engine = LockEngine::new(backend.clone());
    let lock = engine.lock("cycle").ttl(Duration::from_secs(5));
    // Warm the pool and the functions' plans.
    for _ in 0..20 {
        lock.try_acquire().await.unwrap().release().await.unwrap();
    }
    let cycles = 300;
    let mut last = None;
    let (mut acquiring, mut releasing) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..cycles {
        let started = Instant::now();
        let lease = lock.try_acquire().await.unwrap();
        acquiring += started.elapsed();
        assert!(last.is_none_or(|f| lease.fence() > f), "fences rise");
        last = Some(lease.fence());
        let started = Instant::now();
        lease.release().await.unwrap();
        releasing += started.elapsed();
    }
    // The same on the key's shared leases (4 permits).
    let permits = engine.lock("cycle").shared(4).ttl(Duration::from_secs(5));
    for _ in 0..20 {
        permits
            .try_acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let mut last = None;
    let (mut shared_acquiring, mut shared_releasing) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..cycles {
        let started = Instant::now();
        let lease = permits.try_acquire().await.unwrap();
        shared_acquiring += started.elapsed();
        assert!(last.is_none_or(|f| lease.fence() > f), "shared fences rise");
        last = Some(lease.fence());
        let started = Instant::now();
        lease.release().await.unwrap();
        shared_releasing += started.elapsed();
    }
    // The baseline in the same run: a bare round trip on the backend's own pool.
    let started = Instant::now();
    for _ in 0..cycles {
        backend
            .pool()
            .execute(sqlx::raw_sql("SELECT 1"))
            .await
            .unwrap();
    }
    let round_trip = started.elapsed() / cycles;
    println!(
        "postgres uncontended cycle: acquire {:?}, release {:?}; shared: acquire {:?}, \
         release {:?}; a bare SELECT 1 round trip {round_trip:?} ({cycles} each)",
        acquiring / cycles,
        releasing / cycles,
        shared_acquiring / cycles,
        shared_releasing / cycles
    );
}
