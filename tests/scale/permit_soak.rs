//! Permit soaks: workers on several engines take shared permits (three per key) and
//! exclusive ones on two keys, FIFO or not, giving up on some waits mid-flight, in memory
//! and on Redis. Every acquisition is recorded in a
//! [`History`](tower_lock_test_support::history::History) (one clock: the test process's
//! `Instant`), and the checker verifies it: never more than three holders of a key, never
//! anyone beside an exclusive holder, fences rising in grant order, FIFO callers granted
//! in arrival order. The run must also have had three shared holders at once (permits
//! that serialized everything would pass the rest), and leave nothing behind.
//!
//! Each soak is bounded (5 s of work) and stops by itself; `SOAK_SEED=<n>` replays a run's
//! random choices.

use std::{sync::Arc, time::Duration};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;
use tower_lock::{LockEngine, MemoryBackend};
use tower_lock_test_support::history::{History, Mode, Recorder};
use tower_lock_test_support::serial;

const KEYS: [&str; 2] = ["permit-a", "permit-b"];
const PERMITS: usize = 3;
const RUN_FOR: Duration = Duration::from_secs(5);
/// How far apart two FIFO callers' `acquire` calls must be for the checker to hold them to
/// that order: in process, a call takes its place in its first poll.
const FIFO_SLACK: Duration = Duration::from_millis(20);
/// The same across Redis engines, which share no line: their order is the order their
/// calls reach Redis, each through its own engine's connection, its own engine's line for
/// the key (a release of that engine's begun before it), and a CI machine that runs two
/// test binaries and the lints beside this one. Two calls 21 and 23 ms apart were granted
/// in the order they reached Redis there, with the 20 ms in-process slack.
#[cfg(feature = "redis")]
const FIFO_SLACK_ACROSS_ENGINES: Duration = Duration::from_millis(50);

fn seed() -> u64 {
    std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// One worker, task `task` of node `process`: permit cycles until `until`.
async fn worker(
    engine: LockEngine,
    recorder: Recorder,
    who: (u32, u32),
    seed: u64,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while Instant::now() < until {
        let key = KEYS[rng.random_range(0..KEYS.len())];
        let exclusive = rng.random_bool(0.15);
        let fifo = rng.random_bool(0.5);
        let mut permits = engine
            .lock(key)
            .shared(PERMITS as u32)
            .ttl(Duration::from_secs(2))
            .fifo(fifo)
            .wait(Duration::from_millis(500));
        let mode = if exclusive {
            permits = permits.shared(1);
            Mode::Exclusive
        } else {
            Mode::Shared { limit: PERMITS }
        };
        let patience = Duration::from_millis(rng.random_range(5..300));
        let acquiring = recorder.acquiring(who.0, who.1, key, mode, fifo);
        let Ok(Ok(lease)) = tokio::time::timeout(patience, permits.acquire()).await else {
            continue;
        };
        let holding = acquiring.granted(&lease);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..6))).await;
        holding.releasing(&lease);
        if rng.random_bool(0.2) {
            drop(lease);
        } else {
            let _ = lease.release().await;
        }
    }
}

/// Runs four workers per engine on a multi-threaded runtime, checks the history (FIFO
/// callers to `fifo_slack`) and returns it.
async fn soak(engines: Vec<LockEngine>, seed: u64, fifo_slack: Duration) -> History {
    let recorder = Recorder::new();
    let until = Instant::now() + RUN_FOR;
    let mut tasks = Vec::new();
    for (n, engine) in engines.into_iter().enumerate() {
        for t in 0..4u32 {
            let who = (u32::try_from(n).unwrap(), t);
            let seed = seed.wrapping_add(u64::from(who.0) * 1_000 + u64::from(t));
            tasks.push(tokio::spawn(worker(
                engine.clone(),
                recorder.clone(),
                who,
                seed,
                until,
            )));
        }
    }
    for t in tasks {
        t.await.expect("a soak worker panicked");
    }
    let history = recorder.history();
    history.assert_valid(Some(fifo_slack));
    assert_eq!(
        most_shared(&history),
        PERMITS,
        "never {PERMITS} shared holders at once"
    );
    eprintln!(
        "permit soak: {} acquisitions, {} granted",
        history.acquisitions.len(),
        history
            .acquisitions
            .iter()
            .filter(|a| a.grant.is_some())
            .count()
    );
    history
}

/// The most shared holders of one key seen at once, from acquire completion to release.
fn most_shared(history: &History) -> usize {
    let mut most = 0;
    for key in KEYS {
        let mut events: Vec<(Duration, i32)> = Vec::new();
        for a in history.acquisitions.iter().filter(|a| a.key == key) {
            if let (Mode::Shared { .. }, Some(g)) = (a.mode, &a.grant) {
                events.push((a.completed, 1));
                events.push((g.released.unwrap_or(Duration::MAX), -1));
            }
        }
        events.sort();
        let mut now = 0;
        for (_, step) in events {
            now += step;
            most = most.max(usize::try_from(now).unwrap_or(0));
        }
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_permit_soak_keeps_the_bounds_and_the_order() {
    let _group = serial::group(module_path!()).await;
    let seed = seed();
    eprintln!("memory permit soak seed: {seed} (SOAK_SEED={seed} replays it)");
    let backend = Arc::new(MemoryBackend::new());
    let engine = LockEngine::from_arc(backend.clone());
    soak(vec![engine.clone(), engine.clone()], seed, FIFO_SLACK).await;
    // Dropped leases release in the background.
    let give_up = Instant::now() + Duration::from_secs(5);
    while backend.key_count() != 0 {
        assert!(
            Instant::now() < give_up,
            "{} keys kept",
            backend.key_count()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_permit_soak_across_three_engines_keeps_the_bounds_and_the_order() {
    use tower_lock_test_support::redis::{RedisServer, engine, residue};
    // A group of its own: not beside the memory soak's workers, on the same two cores.
    let _group = serial::group(concat!(module_path!(), "::redis")).await;
    let seed = seed();
    eprintln!("redis permit soak seed: {seed} (SOAK_SEED={seed} replays it)");
    let server = RedisServer::start();
    let timeout = Some(Duration::from_millis(300));
    let mut engines = Vec::new();
    for _ in 0..3 {
        engines.push(engine(&server, "permits", timeout).await);
    }
    soak(engines, seed, FIFO_SLACK_ACROSS_ENGINES).await;
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        let left = tokio::task::block_in_place(|| residue(&server, "permits"));
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < give_up, "Redis kept {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
