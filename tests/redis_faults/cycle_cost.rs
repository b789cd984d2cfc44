//! What an uncontended cycle (acquire, release) costs on the server, in both modes, counted
//! by `INFO commandstats`: the lock's must stay two round trips and at most 7 commands
//! (`fence_bound::an_uncontended_cycle_is_two_round_trips_and_at_most_7_commands`), and a
//! shared lease's no more than it cost when shared leases had a protocol of their own (21
//! commands counting both `EVALSHA`s alone on the key, 23 beside another shared holder). The figures, and cycles per second on one connection, are printed
//! (`--nocapture`) for the before/after comparison the one-queue redesign reports.
#![cfg(feature = "redis")]

use std::time::Instant;

use tower_lock::{LockEngine, engine::Mode};
use tower_lock_test_support::redis::{RedisServer, engine};
use tower_lock_test_support::serial;

const CYCLES: u64 = 200;

/// Server-side calls so far, summed over every command but `INFO`, and the `EVALSHA`s.
fn calls(server: &RedisServer) -> (u64, u64) {
    let text = server.cli(["INFO", "commandstats"]);
    let (mut total, mut evalsha) = (0, 0);
    for line in text.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(":calls="))
        else {
            continue;
        };
        let n: u64 = rest
            .split(',')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if name != "info" {
            total += n;
        }
        if name == "evalsha" {
            evalsha = n;
        }
    }
    (total, evalsha)
}

/// `CYCLES` cycles of `key` in `mode`: commands and round trips per cycle, cycles per second.
async fn measure(
    server: &RedisServer,
    node: &LockEngine,
    key: &str,
    mode: Mode,
) -> (f64, f64, f64) {
    let cycle = || async {
        let lease = node.lock(key).in_mode(mode).acquire().await.unwrap();
        lease.release().await.unwrap();
    };
    // The key released before: its tombstone is there, as on a busy key.
    cycle().await;
    let before = tokio::task::block_in_place(|| calls(server));
    let started = Instant::now();
    for _ in 0..CYCLES {
        cycle().await;
    }
    let per_s = CYCLES as f64 / started.elapsed().as_secs_f64();
    let after = tokio::task::block_in_place(|| calls(server));
    let per = |a: u64, b: u64| (a - b) as f64 / CYCLES as f64;
    (per(after.0, before.0), per(after.1, before.1), per_s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_cycle_costs_no_more_than_before_and_the_locks_keeps_its_cost() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let node = engine(&server, "cost", None).await;
    let lone = measure(&server, &node, "lone", Mode::Exclusive).await;
    let shared = measure(&server, &node, "shared", Mode::Shared { limit: 3 }).await;
    // Beside another shared holder, which stays.
    let other = node.lock("beside").shared(3).acquire().await.unwrap();
    let beside = measure(&server, &node, "beside", Mode::Shared { limit: 3 }).await;
    other.release().await.unwrap();
    for (what, (commands, round_trips, per_s)) in [
        ("lock", lone),
        ("shared", shared),
        ("shared beside another", beside),
    ] {
        println!(
            "uncontended {what} cycle: {commands:.2} commands, {round_trips:.2} round trips, {per_s:.0} cycles/s"
        );
    }
    assert!(lone.0 <= 7.0 && lone.1 == 2.0, "lock: {lone:?}");
    for (figures, before) in [(shared, 21.0), (beside, 23.0)] {
        assert!(
            figures.0 <= before && figures.1 == 2.0,
            "shared: {figures:?}"
        );
    }
}
