//! A seeded fault schedule, checked through its recorded history: three engines with
//! different settings (TTL, FIFO, timeouts) take locks on a few keys, and on one key
//! lone and shared clients mixed (its lock, `shared(1)`, `shared(2)`, `shared(3)`), giving up
//! on waits mid-flight, abandoning registered waiters, letting unrenewed leases expire,
//! while a fault injector, driven by the same seed, picks one fault after another:
//!
//! | backend | faults |
//! | --- | --- |
//! | Redis | killed and restarted (its state lost), suspended (SIGSTOP), `CLIENT PAUSE`, every client connection killed, a holder process SIGSTOPped past its TTL then resumed or SIGKILLed |
//! | Redis Cluster | the primary of a key's slot suspended (under the node timeout: no failover), paused, its connections killed; a holder process SIGSTOPped past its TTL then resumed or SIGKILLed |
//! | Postgres | killed (immediate shutdown) and restarted, frozen (SIGSTOP of every process), the pool's and the listeners' connections killed (`pg_terminate_backend`), a holder process SIGSTOPped past its TTL then resumed or SIGKILLed |
//! | in process | force releases (every holder of a key, in either mode), and the workers' own cancellations and expiries |
//!
//! Every acquisition and every write to a fenced register (one per lock key, on a Redis
//! server of its own that no fault touches, so the holder processes write to it too) is
//! recorded, and the history checker verifies at the end: no two holders at once unless the
//! earlier was told its lease was lost, on the mixed key a holder alone beside nobody of
//! either mode and each shared grant beside fewer than its own limit, fences rising in
//! grant order across both modes, a register a sequential execution explains, FIFO grants
//! in arrival order across both modes (arrivals further apart than the longest pause), and
//! nothing left behind.
//!
//! A holder process frozen by SIGSTOP takes no action until it is resumed: its hold is
//! recorded as ending where it was frozen, and what it does after resuming (a fenced write
//! with the fence it was granted, whatever it believes) is judged by the register: exclusion
//! in real time is not promised to a process the OS has paused, fencing is.
//!
//! Bounded by default (`FAULT_SECS`, 6 s of work per backend); `FAULT_SEED=<n>` replays a
//! run's random choices (the seed is printed first, and again in a failure's message). A
//! long run: `FAULT_SECS=120 cargo test --release --all-features --test scale fault_schedule`.

use std::{sync::Arc, thread, time::Duration};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;
use tower_lock::{LockEngine, LockError, MemoryBackend};
use tower_lock_test_support::history::{History, Mode, Recorder, Write};
use tower_lock_test_support::serial;

mod apart;
#[cfg(feature = "redis")]
mod holder;
#[cfg(all(feature = "postgres", feature = "redis"))]
mod postgres;
#[cfg(feature = "redis")]
mod redis_backends;
mod registers;

use registers::Registers;

/// Lock keys: each has a fenced register.
const LOCK_KEYS: [&str; 2] = ["fault-a", "fault-b"];
/// A key of lone and shared clients mixed: held alone (its lock, or a shared lease with a
/// limit of 1), or by up to [`PERMITS`] (or one more, for requests that allow it) shared
/// holders. It has a fenced register too, which those alone write.
const PERMIT_KEY: &str = "fault-p";
const PERMITS: u32 = 2;
/// The longest stretch a fault keeps the server from answering: FIFO order is judged
/// between arrivals further apart than this (a paused server executes what queued up in
/// its sockets in no promised order across connections).
const LONGEST_PAUSE: Duration = Duration::from_millis(400);
/// Holder processes' lease TTL.
#[cfg(feature = "redis")]
const CHILD_TTL: Duration = Duration::from_millis(300);

fn seed() -> u64 {
    std::env::var("FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

fn run_for() -> Duration {
    Duration::from_secs(
        std::env::var("FAULT_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(6),
    )
}

/// The settings of one engine of the schedule.
#[derive(Clone, Copy, Debug)]
struct Settings {
    ttl: Duration,
    /// `None`: FIFO or not, chosen per call.
    fifo: Option<bool>,
}

const SETTINGS: [Settings; 3] = [
    Settings {
        ttl: Duration::from_millis(400),
        fifo: Some(true),
    },
    Settings {
        ttl: Duration::from_secs(1),
        fifo: Some(false),
    },
    Settings {
        ttl: Duration::from_millis(250),
        fifo: None,
    },
];

/// One worker (`who`: its engine and task) of an engine with `settings`: lock cycles with
/// a fenced read-modify-write, and permit cycles, until `until`.
async fn worker(
    engine: LockEngine,
    (recorder, registers): (Recorder, Registers),
    who: (u32, u32),
    settings: Settings,
    seed: u64,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (process, task) = who;
    while Instant::now() < until {
        let fifo = settings.fifo.unwrap_or_else(|| rng.random_bool(0.5));
        let wait = Duration::from_millis(rng.random_range(0..600));
        let permits = rng.random_bool(0.3);
        // (key, the history's mode, a lease that writes the key's register, whether it may
        // expire while held)
        let (key, mode, lock, writes, expiring) = if permits {
            // Lone and shared clients on one key: the key's lock, a shared lease with a
            // limit of 1 (alone too), and shared leases with limits 2 and 3 (each request
            // brings its own). Those alone write the key's register; the others read it.
            let (lock, mode) = match rng.random_range(0..20) {
                0..=2 => (engine.lock(PERMIT_KEY), Mode::Exclusive),
                3..=4 => (engine.lock(PERMIT_KEY).shared(1), Mode::Exclusive),
                5..=14 => (
                    engine.lock(PERMIT_KEY).shared(PERMITS),
                    Mode::Shared {
                        limit: PERMITS as usize,
                    },
                ),
                _ => (
                    engine.lock(PERMIT_KEY).shared(PERMITS + 1),
                    Mode::Shared {
                        limit: PERMITS as usize + 1,
                    },
                ),
            };
            let lock = lock.ttl(settings.ttl).fifo(fifo).wait(wait);
            (PERMIT_KEY, mode, lock, mode == Mode::Exclusive, false)
        } else {
            let key = LOCK_KEYS[rng.random_range(0..LOCK_KEYS.len())];
            // Some leases are never renewed and outlive their TTL while held.
            let expiring = rng.random_bool(0.1);
            let lock = engine
                .lock(key)
                .ttl(if expiring {
                    Duration::from_millis(80)
                } else {
                    settings.ttl
                })
                .auto_renew(!expiring)
                .fifo(fifo)
                .wait(wait);
            (key, Mode::Exclusive, lock, true, expiring)
        };
        if rng.random_bool(0.05) {
            // A waiter registered, then abandoned unpolled for a while before it is dropped.
            let _acquiring = recorder.acquiring(process, task, key, mode, fifo);
            let mut waiter = Box::pin(lock.acquire());
            let _ = poll_once(waiter.as_mut());
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..80))).await;
            continue;
        }
        // The caller sometimes gives up on the acquire mid-flight.
        let patience = Duration::from_millis(rng.random_range(0..700));
        let acquiring = recorder.acquiring(process, task, key, mode, fifo);
        let lease = match tokio::time::timeout(patience, lock.acquire()).await {
            Ok(Ok(lease)) => lease,
            Ok(Err(LockError::Backend(_))) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(_) | Ok(Err(_)) => continue,
        };
        let holding = acquiring.granted(&lease);
        if writes {
            let fence = lease.fence().get();
            if let Some(read) = registers.call(key, fence, None).await {
                let work = if expiring {
                    rng.random_range(0..150)
                } else {
                    rng.random_range(0..5)
                };
                tokio::time::sleep(Duration::from_millis(work)).await;
                // Writes go out whatever the writer believes: the fence is the guard.
                let invoked = recorder.now();
                let accepted = registers.call(key, fence, Some(read + 1)).await.is_some();
                recorder.write(Write {
                    process,
                    task,
                    key: key.to_owned(),
                    fence,
                    read,
                    value: read + 1,
                    accepted,
                    invoked,
                    completed: recorder.now(),
                });
            }
        } else {
            // A shared holder reads with its fence: a lone holder granted before it (whose
            // lease was lost meanwhile) then finds its late write refused.
            let _ = registers.call(key, lease.fence().get(), None).await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..8))).await;
        }
        holding.releasing(&lease);
        match rng.random_range(0..10) {
            0..=1 => drop(lease),
            2 => {
                let patience = Duration::from_micros(rng.random_range(0..1_500));
                let _ = tokio::time::timeout(patience, lease.release()).await;
            }
            _ => {
                let _ = lease.release().await;
            }
        }
    }
}

fn poll_once<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    fut.poll(&mut cx).is_ready()
}

/// Engine `n` of the schedule, its workers on a runtime of their own on a thread of its
/// own (a node of the fleet).
fn node(
    make: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = LockEngine>>>
    + Send
    + 'static,
    shared: (Recorder, Registers),
    built: std::sync::mpsc::Sender<()>,
    n: u32,
    seed: u64,
    until: std::time::Instant,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let engine = make().await;
            // The faults begin once every node has its engine: a build that meets one
            // fails (`build()` checks the server), which is not what the schedule tests.
            let _ = built.send(());
            let until = Instant::from_std(until);
            let settings = SETTINGS[n as usize % SETTINGS.len()];
            let tasks: Vec<_> = (0..3u32)
                .map(|t| {
                    tokio::spawn(worker(
                        engine.clone(),
                        shared.clone(),
                        (n, t),
                        settings,
                        seed.wrapping_add(u64::from(n) * 1_000 + u64::from(t)),
                        until,
                    ))
                })
                .collect();
            for t in tasks {
                t.await.expect("a schedule worker panicked");
            }
        });
    })
}

/// The faults a backend offers the schedule.
trait Faults {
    /// One fault, chosen by `rng`; returns what it was, for the log.
    fn inject(&self, rng: &mut StdRng, recorder: &Recorder) -> String;
}

/// Drives the schedule: engines from `make`, faults from `faults` until the run ends, then
/// the history check.
fn schedule(
    name: &str,
    make: impl Fn(u32) -> std::pin::Pin<Box<dyn std::future::Future<Output = LockEngine>>>
    + Send
    + Sync
    + Clone
    + 'static,
    registers: &Registers,
    (recorder, faults): (Recorder, &dyn Faults),
) {
    let (history, seed, log) = run(name, make, registers, (recorder, faults), run_for());
    let violations = history.violations(Some(LONGEST_PAUSE));
    let mut by_check = std::collections::BTreeMap::<&str, usize>::new();
    for v in &violations {
        *by_check.entry(v.check).or_default() += 1;
    }
    eprintln!(
        "{name} fault schedule, seed {seed}: {} violations {by_check:?}",
        violations.len()
    );
    if !violations.is_empty() {
        // The seed and the faults first, then each violation with its window.
        eprintln!("seed {seed} (FAULT_SEED={seed} replays it): faults {log:?}");
    }
    history.assert_valid(Some(LONGEST_PAUSE));
    let granted = history.acquisitions.iter().any(|a| a.grant.is_some());
    let accepted = history.writes.iter().any(|w| w.accepted);
    assert!(granted && accepted, "no critical section ever ran");
}

/// Runs the schedule for `run_for`: its history, its seed, and the faults it injected.
fn run(
    name: &str,
    make: impl Fn(u32) -> std::pin::Pin<Box<dyn std::future::Future<Output = LockEngine>>>
    + Send
    + Sync
    + Clone
    + 'static,
    registers: &Registers,
    (recorder, faults): (Recorder, &dyn Faults),
    run_for: Duration,
) -> (History, u64, Vec<String>) {
    let seed = seed();
    eprintln!("{name} fault schedule seed: {seed} (FAULT_SEED={seed} replays it)");
    let until = std::time::Instant::now() + run_for;
    let (built, all_built) = std::sync::mpsc::channel();
    let nodes: Vec<_> = (0..3u32)
        .map(|n| {
            let make = make.clone();
            node(
                move || make(n),
                (recorder.clone(), registers.clone()),
                built.clone(),
                n,
                seed,
                until,
            )
        })
        .collect();
    drop(built);
    // Every node built (or one failed to: its panic is reported when it is joined).
    for _ in 0..nodes.len() {
        if all_built.recv().is_err() {
            break;
        }
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfa17);
    let mut log = Vec::new();
    while std::time::Instant::now() + Duration::from_millis(1_500) < until {
        thread::sleep(Duration::from_millis(rng.random_range(200..1_200)));
        log.push(faults.inject(&mut rng, &recorder));
    }
    for n in nodes {
        n.join().expect("a schedule node panicked");
    }
    let finals = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(registers.finals());
    for (key, value) in finals {
        recorder.final_value(&key, value);
    }
    let history = recorder.history();
    let granted = history
        .acquisitions
        .iter()
        .filter(|a| a.grant.is_some())
        .count();
    let accepted = history.writes.iter().filter(|w| w.accepted).count();
    eprintln!(
        "{name} fault schedule: {} acquisitions ({granted} granted), {} writes ({accepted} accepted), faults: {}",
        history.acquisitions.len(),
        history.writes.len(),
        log.join(", ")
    );
    (history, seed, log)
}

/// Force releases (of every holder of a key, in either mode), the in-process engine's one
/// fault from outside.
struct ForceReleases(LockEngine);

impl Faults for ForceReleases {
    fn inject(&self, rng: &mut StdRng, recorder: &Recorder) -> String {
        let keys = [LOCK_KEYS[0], LOCK_KEYS[1], PERMIT_KEY];
        let key = keys[rng.random_range(0..keys.len())];
        let invoked = recorder.now();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime
            .block_on(self.0.admin().force_release(key))
            .expect("in process");
        recorder.revocation(key, invoked);
        format!("force release {key}")
    }
}

/// Engines for the schedule: handles of one in-process engine.
fn in_process(
    engine: &LockEngine,
) -> impl Fn(u32) -> std::pin::Pin<Box<dyn std::future::Future<Output = LockEngine>>>
+ Send
+ Sync
+ Clone
+ 'static {
    let engine = engine.clone();
    move |_| {
        let engine = engine.clone();
        Box::pin(async move { engine })
    }
}

#[test]
fn memory_fault_schedule_keeps_every_check() {
    let _group = serial::group_blocking(module_path!());
    let backend = Arc::new(MemoryBackend::new());
    let engine = LockEngine::from_arc(backend.clone());
    schedule(
        "memory",
        in_process(&engine),
        &Registers::Local(Arc::default(), true),
        (Recorder::new(), &ForceReleases(engine.clone())),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            for key in [LOCK_KEYS[0], LOCK_KEYS[1], PERMIT_KEY] {
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

/// The deliberate break: the same schedule over a store that ignores fences (it accepts a
/// stale holder's write) must be caught by the checker, as lost updates.
#[test]
fn a_schedule_over_a_store_that_ignores_fences_is_caught() {
    let _group = serial::group_blocking(module_path!());
    let engine = LockEngine::in_memory();
    let (history, seed, _) = run(
        "memory, fences ignored",
        in_process(&engine),
        &Registers::Local(Arc::default(), false),
        (Recorder::new(), &ForceReleases(engine.clone())),
        Duration::from_secs(4),
    );
    let caught = history.violations(None);
    assert!(
        caught.iter().any(|v| v.check == "register"),
        "seed {seed}: a store that ignores fences went unnoticed"
    );
    eprintln!("caught, as it must be:\n{}", caught[0]);
}

/// The deliberate break of cross-mode exclusion: the same schedule over a backend that
/// keeps each key's lock apart from its shared leases must be caught by the checker, as
/// a lone holder beside shared ones on the mixed key.
#[test]
fn a_schedule_over_a_lock_apart_from_its_shared_leases_is_caught() {
    let _group = serial::group_blocking(module_path!());
    let engine = LockEngine::new(apart::Apart(Arc::new(MemoryBackend::new())));
    let (history, seed, _) = run(
        "memory, the lock apart from the shared leases",
        in_process(&engine),
        &Registers::Local(Arc::default(), true),
        (Recorder::new(), &apart::NoFaults),
        Duration::from_secs(4),
    );
    let caught = history.violations(None);
    let mixed = caught
        .iter()
        .find(|v| v.check == "exclusion" && v.what.contains(PERMIT_KEY));
    assert!(
        mixed.is_some(),
        "seed {seed}: a lock apart from its shared leases went unnoticed"
    );
    eprintln!("caught, as it must be:\n{}", mixed.unwrap());
}
