//! Exclusion soaks: workers on two engines, each in a runtime of its own, doing contended
//! lock cycles on a few keys while cancelling acquires and releases mid-flight, dropping
//! leases, letting some expire; on Redis with one restart in the middle, on Postgres, in
//! memory with admin force-releases and waiters dropped long after their grant.
//!
//! Every critical section reads and writes a store that accepts a read or a write only
//! with a fence at least as high as the highest it has seen (the storage-side guard that
//! fencing tokens exist for). Every acquisition, write and force release is recorded in a
//! [`History`](tower_lock_test_support::history::History) (one clock: the test process's
//! `Instant`), and at the end:
//! - the history checker finds no two holders of a key at once unless the earlier had
//!   been told its lease was lost, fences rising in grant order, a store whose accepted
//!   writes a sequential execution explains (no lost update), and FIFO grants in arrival
//!   order;
//! - no write was refused for a stale fence while its writer still believed its lease
//!   valid (`!lost()` and `owned()`, checked atomically with the write);
//! - nothing is left behind but the documented fence tombstones.
//!
//! Each soak is bounded (about 20 s on Redis, 10 s on Postgres, 8 s in memory) and stops by
//! itself. The seed is printed; `SOAK_SEED=<n>` replays a run's random choices.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::{sync::Mutex, time::Instant};
use tower_lock::{Lease, LockEngine, LockError, MemoryBackend};
use tower_lock_test_support::history::{Mode, Recorder, Write};
#[cfg(feature = "redis")]
use tower_lock_test_support::redis::RedisServer;
use tower_lock_test_support::serial;

const KEYS: [&str; 3] = ["soak-a", "soak-b", "soak-c"];

/// FIFO callers that arrive further apart than this are granted in arrival order: it
/// covers the stretch between calling `acquire` and taking a ticket (the node's own
/// release of the key landing first, then the script's round trip). 20 ms was once too
/// little in CI, three test binaries on 2 cores: a caller 30 ms before another on the other
/// engine took its ticket after it, its own release of the key still in flight.
const FIFO_SLACK: Duration = Duration::from_millis(50);

/// On Postgres the stretch from the call to the ticket is longer: the node's own release of
/// the key lands first, then the attempt takes a pooled connection and commits its ticket
/// (a run on a loaded 2-core machine saw a caller 25 ms before another take its ticket
/// after it). Order across nodes is the server's ticket order; a caller is in line from
/// its ticket on.
#[cfg(feature = "postgres")]
const POSTGRES_FIFO_SLACK: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Cell {
    /// The highest fence the store has seen for the key, on a read or a write.
    fence: u64,
    value: u64,
    accepted: u64,
}

#[derive(Default)]
struct Store {
    cells: Mutex<HashMap<&'static str, Cell>>,
    history: Recorder,
    /// Writes refused while their writer believed its lease valid: must stay 0.
    violations: AtomicU64,
    cycles: AtomicU64,
    refused: AtomicU64,
    cancelled: AtomicU64,
    expired: AtomicU64,
    errors: AtomicU64,
}

impl Store {
    /// A fenced read: refused (`None`) when a higher fence was already seen.
    async fn read(&self, key: &'static str, fence: u64) -> Option<u64> {
        let mut cells = self.cells.lock().await;
        let cell = cells.entry(key).or_default();
        if fence < cell.fence {
            return None;
        }
        cell.fence = fence;
        Some(cell.value)
    }

    /// A fenced write of `read + 1`, with the writer's belief checked in the same step.
    async fn write(
        &self,
        (process, task): (u32, u32),
        key: &'static str,
        lease: &Lease,
        read: u64,
    ) {
        let fence = lease.fence().get();
        let invoked = self.history.now();
        let mut cells = self.cells.lock().await;
        // Under the store's lock: nobody else reads or writes while the belief is taken.
        let believed = !lease.is_lost() && lease.owned().await.unwrap_or(false);
        let cell = cells.entry(key).or_default();
        let accepted = fence >= cell.fence;
        self.history.write(Write {
            process,
            task,
            key: key.to_owned(),
            fence,
            read,
            value: read + 1,
            accepted,
            invoked,
            completed: self.history.now(),
        });
        if accepted {
            cell.fence = fence;
            cell.value = read + 1;
            cell.accepted += 1;
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
            if believed {
                self.violations.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "violation: {key} write with fence {fence} refused (store at {}) while its writer believed its lease valid",
                    cell.fence
                );
            }
        }
    }

    async fn check(&self) {
        self.check_with(FIFO_SLACK).await;
    }

    /// [`check`](Self::check), FIFO arrivals within `fifo_slack` of each other unordered.
    async fn check_with(&self, fifo_slack: Duration) {
        let cells = self.cells.lock().await;
        for (key, cell) in cells.iter() {
            self.history.final_value(key, cell.value);
        }
        let history = self.history.history();
        history.assert_valid(Some(fifo_slack));
        let total: u64 = cells.values().map(|c| c.accepted).sum();
        eprintln!(
            "soak: {} cycles, {total} writes accepted, {} refused (stale), {} cancelled, {} expired, {} backend errors; the history of {} acquisitions checked",
            self.cycles.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.cancelled.load(Ordering::Relaxed),
            self.expired.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
            history.acquisitions.len(),
        );
        assert!(total > 0, "no critical section ever ran");
        assert_eq!(
            self.violations.load(Ordering::Relaxed),
            0,
            "writes refused while their writers believed their leases valid"
        );
    }
}

fn seed() -> u64 {
    std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// One worker (`who`: its node and task): contended cycles with random cancellations,
/// drops and expiries until `until`, each recorded in the store's history.
async fn worker(
    engine: LockEngine,
    store: Arc<Store>,
    who: (u32, u32),
    seed: u64,
    until: Instant,
    chaos: bool,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let history = store.history.clone();
    let (process, task) = who;
    while Instant::now() < until {
        let key = KEYS[rng.random_range(0..KEYS.len())];
        // Some leases are never renewed and outlive their TTL while held.
        let expiring = rng.random_bool(0.1);
        let fifo = rng.random_bool(0.5);
        let lock = engine
            .lock(key)
            .ttl(Duration::from_millis(if expiring { 60 } else { 400 }))
            .auto_renew(!expiring)
            .fifo(fifo)
            .wait(Duration::from_millis(rng.random_range(0..300)));
        if chaos && rng.random_bool(0.05) {
            // A waiter registered, then abandoned unpolled for a while before it is dropped.
            let _acquiring = history.acquiring(process, task, key, Mode::Exclusive, fifo);
            let mut waiter = Box::pin(lock.acquire());
            let _ = futures_poll_once(waiter.as_mut());
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..80))).await;
            drop(waiter);
            store.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if chaos && rng.random_bool(0.03) {
            let invoked = history.now();
            let _ = engine.admin().force_release(key).await;
            history.revocation(key, invoked);
        }
        // The caller sometimes gives up on the acquire mid-flight.
        let patience = Duration::from_millis(rng.random_range(0..400));
        let acquiring = history.acquiring(process, task, key, Mode::Exclusive, fifo);
        let lease = match tokio::time::timeout(patience, lock.acquire()).await {
            Err(_) => {
                store.cancelled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(Err(LockError::Backend(_))) => {
                store.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            Ok(Err(_)) => continue,
            Ok(Ok(lease)) => lease,
        };
        let holding = acquiring.granted(&lease);
        store.cycles.fetch_add(1, Ordering::Relaxed);
        if let Some(read) = store.read(key, lease.fence().get()).await {
            let work = if expiring {
                rng.random_range(0..120)
            } else {
                rng.random_range(0..4)
            };
            tokio::time::sleep(Duration::from_millis(work)).await;
            if lease.is_lost() {
                store.expired.fetch_add(1, Ordering::Relaxed);
            }
            // Writes go out whatever the writer believes: the fence is the store's guard.
            store.write(who, key, &lease, read).await;
        }
        // The hold ends where the release (or drop) begins.
        holding.releasing(&lease);
        match rng.random_range(0..10) {
            // Dropped: released in the background.
            0..=1 => drop(lease),
            // A release the caller gives up on mid-flight.
            2..=3 => {
                let patience = Duration::from_micros(rng.random_range(0..1_500));
                if tokio::time::timeout(patience, lease.release())
                    .await
                    .is_err()
                {
                    store.cancelled.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                let _ = lease.release().await;
            }
        }
    }
}

/// Poll a future once (registers a waiter without waiting).
fn futures_poll_once<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    fut.poll(&mut cx).is_ready()
}

/// Runs `workers` workers of `engine` on a runtime of their own, on a thread of its own:
/// node `process` of the history.
fn node(
    make: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = LockEngine>>>
    + Send
    + 'static,
    store: Arc<Store>,
    (process, workers): (u32, u64),
    seed: u64,
    run_for: Duration,
    chaos: bool,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let engine = make().await;
            let until = Instant::now() + run_for;
            let tasks: Vec<_> = (0..workers)
                .map(|w| {
                    tokio::spawn(worker(
                        engine.clone(),
                        store.clone(),
                        (process, u32::try_from(w).unwrap()),
                        seed.wrapping_add(w),
                        until,
                        chaos,
                    ))
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
    })
}

// The Redis soak needs the Redis backend; the in-process one runs in every build.
#[cfg(feature = "redis")]
#[test]
fn redis_exclusion_soak_across_two_engines_and_a_restart() {
    let _group = serial::group_blocking(module_path!());
    let seed = seed();
    eprintln!("redis soak seed: {seed} (SOAK_SEED={seed} replays it)");
    let redis = Arc::new(RedisServer::start());
    let store = Arc::new(Store::default());
    let run_for = Duration::from_secs(20);
    let nodes: Vec<_> = (0..2u64)
        .map(|n| {
            let url = redis.url();
            node(
                move || {
                    Box::pin(async move {
                        let backend = tower_lock::engine::redis::RedisBackend::builder(url)
                            .prefix("soak")
                            .command_timeout(Duration::from_millis(200))
                            .build()
                            .await
                            .expect("connect to the soak's redis-server");
                        LockEngine::new(backend)
                    })
                },
                store.clone(),
                (u32::try_from(n).unwrap(), 4),
                seed.wrapping_add(n * 1_000),
                run_for,
                false,
            )
        })
        .collect();
    thread::sleep(run_for / 2);
    // The restart loses the queues: FIFO order holds again among those who arrive after it.
    let began = store.history.now();
    redis.restart();
    store.history.outage(began);
    for n in nodes {
        n.join().expect("a soak node panicked");
    }
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(store.check());
    // Nothing left but fence tombstones (and waiter tickets, which lapse by their TTL).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = redis
            .scan("soak:*")
            .into_iter()
            .filter(|k| {
                !k.split_once("}:")
                    .is_some_and(|(_, r)| r.starts_with("fence:"))
            })
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Redis kept {left:?} after the soak"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

// The Postgres soak: two engines (nodes) on one schema, no fault. Its history passes the
// same checks, FIFO included (arrival is the `acquire` call, the grant order the fences'),
// with the slack of the stretch before a Postgres ticket.
#[cfg(feature = "postgres")]
#[test]
fn postgres_exclusion_soak_across_two_engines() {
    use tower_lock::engine::postgres::PostgresBackend;
    let _group = serial::group_blocking(module_path!());
    let seed = seed();
    eprintln!("postgres soak seed: {seed} (SOAK_SEED={seed} replays it)");
    let server = tower_lock_test_support::postgres::PostgresServer::start();
    let url = server.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime
        .block_on(
            PostgresBackend::builder(url.clone())
                .schema("soak")
                .migrate(),
        )
        .expect("migrate the soak's schema");
    let store = Arc::new(Store::default());
    let run_for = Duration::from_secs(10);
    let nodes: Vec<_> = (0..2u64)
        .map(|n| {
            let url = url.clone();
            node(
                move || {
                    Box::pin(async move {
                        let backend = PostgresBackend::builder(url)
                            .schema("soak")
                            .pool_size(4)
                            .build()
                            .await
                            .expect("connect to the soak's postgres");
                        LockEngine::new(backend)
                    })
                },
                store.clone(),
                (u32::try_from(n).unwrap(), 4),
                seed.wrapping_add(n * 1_000),
                run_for,
                false,
            )
        })
        .collect();
    for n in nodes {
        n.join().expect("a soak node panicked");
    }
    runtime.block_on(store.check_with(POSTGRES_FIFO_SLACK));
}

#[test]
fn memory_exclusion_soak_with_force_releases_and_abandoned_waiters() {
    let _group = serial::group_blocking(module_path!());
    let seed = seed();
    eprintln!("memory soak seed: {seed} (SOAK_SEED={seed} replays it)");
    let backend = Arc::new(MemoryBackend::new());
    let engine = LockEngine::from_arc(backend.clone());
    let store = Arc::new(Store::default());
    let run_for = Duration::from_secs(8);
    let nodes: Vec<_> = (0..2u64)
        .map(|n| {
            let engine = engine.clone();
            node(
                move || Box::pin(async move { engine }),
                store.clone(),
                (u32::try_from(n).unwrap(), 4),
                seed.wrapping_add(n * 1_000),
                run_for,
                true,
            )
        })
        .collect();
    for n in nodes {
        n.join().expect("a soak node panicked");
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(store.check());
    runtime.block_on(async {
        // Releases of dropped leases finish on the engine's runtime: allow them a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            // Reading a key expires what has run out (as any access does).
            for key in KEYS {
                engine.lock(key).locked().await.unwrap();
            }
            if backend.key_count() == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} keys kept",
                backend.key_count()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}
