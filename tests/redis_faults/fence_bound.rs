//! Fences against a server whose clock is stepped (libfaketime), and the fence tombstone's
//! lifetime. What must hold:
//! - a fence never goes backwards when the server clock steps back by less than the
//!   documented bound (the lease TTL or 10 s, whichever is shorter), on every path: a
//!   release, a hand-off to a waiter that has gone whose claim lapses unreleased, permits;
//! - a tombstone outlives its release by at most 10 s, whatever the lease had left;
//! - an uncontended acquire and release cost two round trips and at most 7 Redis commands.
//!
//! Stepping the clock forward expires keys at once (their expiry is absolute), so no test
//! waits out a claim period or a tombstone.
#![cfg(feature = "redis")]

use std::time::Duration;

use tower_lock::LockEngine;
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine};
use tower_lock_test_support::serial;

use crate::vanished::{Kind, queue_and_kill};

/// The documented bound with the default TTL (30 s): 10 s. The step back stays inside it.
const STEP_BACK: i64 = 5;
/// The tombstone's promise: at most this long after a release.
const TOMBSTONE: Duration = Duration::from_secs(10);

async fn engine(server: &RedisServer, prefix: &str) -> LockEngine {
    redis_engine(server, prefix, None).await
}

/// The remaining TTL of the one key under `prefix` whose kind word is `kind`.
fn pttl_of(server: &RedisServer, prefix: &str, kind: &str) -> Option<Duration> {
    let key = server
        .scan(&format!("{prefix}:*"))
        .into_iter()
        .find(|k| k.contains(&format!("}}:{kind}:")))?;
    let ms: i64 = server.cli(["PTTL", &key]).parse().unwrap();
    Some(Duration::from_millis(u64::try_from(ms).ok()?))
}

/// A waiter that died while queued is handed the key; its claim (3 s) runs out with no
/// release; the server clock then steps back 5 s. The next holder's fence is above the
/// hand-off's, on the lock and on permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_to_a_vanished_waiter_that_lapses_keeps_fences_rising_through_a_clock_step_back()
{
    let _group = serial::group(module_path!()).await;
    for kind in [Kind::Lock, Kind::Permit] {
        let server = RedisServer::start_with_clock();
        let node = engine(&server, "lapsed").await;
        let (holder, name) = match kind {
            Kind::Lock => (node.lock("k").fifo(true).acquire().await.unwrap(), "lock"),
            Kind::Permit => (
                node.lock("k").shared(1).fifo(true).acquire().await.unwrap(),
                "permits",
            ),
        };
        queue_and_kill(&server, &node, "lapsed", "k", kind, "vanished").await;
        // Handed to the dead waiter, with the next fence.
        let handed = holder.fence().get() + 1;
        holder.release().await.unwrap();
        // Its claim lapses (the clock 4 s ahead): nobody holds the key, nobody released it.
        tokio::task::block_in_place(|| server.set_clock(4));
        match kind {
            Kind::Lock => assert!(node.lock("k").holder().await.unwrap().is_none()),
            Kind::Permit => assert!(node.lock("k").shared(1).holders().await.unwrap().is_empty()),
        }
        let kept = tokio::task::block_in_place(|| pttl_of(&server, "lapsed", "fence"));
        // Then the clock steps back, by less than the bound.
        tokio::task::block_in_place(|| server.set_clock(4 - STEP_BACK));
        let next = match kind {
            Kind::Lock => node.lock("k").acquire().await.unwrap(),
            Kind::Permit => node.lock("k").shared(1).acquire().await.unwrap(),
        };
        assert!(
            next.fence().get() > handed,
            "{name}: the fence went backwards: {} after the lapsed hand-off's {handed} (clock stepped back {STEP_BACK} s)",
            next.fence().get()
        );
        if let Kind::Lock = kind {
            let kept = kept.expect("the hand-off's fence outlives its claim");
            assert!(
                kept <= TOMBSTONE,
                "the hand-off's fence lives {kept:?} after its claim lapsed"
            );
        }
        next.release().await.unwrap();
    }
}

/// A lease with a TTL of an hour, released at once, leaves its tombstone for at most 10 s
/// (not the hour), on the lock, on a lock that had a waiter, and on permits; and once the
/// tombstone is gone a clock step back inside the bound still gives a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_outlives_its_release_by_at_most_10s_and_keeps_the_bound() {
    let _group = serial::group(module_path!()).await;
    const HOUR: Duration = Duration::from_secs(3600);
    for (path, kind) in [
        ("release", "fence"),
        ("release after a waiter left", "fence"),
        ("permits' release", "fence"),
    ] {
        let server = RedisServer::start_with_clock();
        let node = engine(&server, "tomb").await;
        let lease = match path {
            "permits' release" => node.lock("k").shared(2).ttl(HOUR).acquire().await.unwrap(),
            _ => node.lock("k").ttl(HOUR).acquire().await.unwrap(),
        };
        if path == "release after a waiter left" {
            // A waiter registers (the holder's value is marked) and gives up.
            let waited = node
                .lock("k")
                .wait(Duration::from_millis(300))
                .acquire()
                .await;
            assert!(waited.is_err());
        }
        let released = lease.fence();
        lease.release().await.unwrap();
        let left =
            tokio::task::block_in_place(|| pttl_of(&server, "tomb", kind)).expect("a tombstone");
        assert!(
            left <= TOMBSTONE,
            "{path}: the tombstone of a released {HOUR:?} lease lives {left:?}"
        );
        // The tombstone expires (the clock 11 s ahead), then the clock steps back 5 s.
        tokio::task::block_in_place(|| server.set_clock(11));
        assert!(tokio::task::block_in_place(|| pttl_of(&server, "tomb", kind)).is_none());
        tokio::task::block_in_place(|| server.set_clock(11 - STEP_BACK));
        let next = match path {
            "permits' release" => node.lock("k").shared(2).acquire().await.unwrap(),
            _ => node.lock("k").acquire().await.unwrap(),
        };
        assert!(
            next.fence() > released,
            "{path}: the fence went backwards: {:?} after {released:?}",
            next.fence(),
        );
        next.release().await.unwrap();
    }
}

/// Server-side calls so far, per command (`INFO commandstats`).
fn command_calls(server: &RedisServer) -> std::collections::BTreeMap<String, u64> {
    server
        .cli(["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

/// The uncontended cycle (acquire, release, on a key released before): two script calls
/// (round trips), at most 7 commands counting them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_two_round_trips_and_at_most_7_commands() {
    let _group = serial::group(module_path!()).await;
    const CYCLES: u64 = 50;
    let server = RedisServer::start();
    let node = engine(&server, "cycle").await;
    node.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = tokio::task::block_in_place(|| command_calls(&server));
    for _ in 0..CYCLES {
        node.lock("k")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let after = tokio::task::block_in_place(|| command_calls(&server));
    let delta: std::collections::BTreeMap<_, _> = after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    let total: u64 = delta.values().sum();
    assert_eq!(delta.get("evalsha"), Some(&(2 * CYCLES)), "{delta:?}");
    assert!(
        total <= 7 * CYCLES,
        "{} commands per uncontended cycle: {delta:?}",
        total as f64 / CYCLES as f64
    );
}

/// The uncontended cycle's fast paths (the grant from the tombstone, and the release of a
/// holder alone that nobody queued behind: both run before the scripts' prelude, which
/// they do not need) keep every promise of the full scripts: each grant's fence is the
/// last one + 1, for the lock and for a shared request alone (`shared(1)`), with a holder
/// label stored beside the token (the release must still recognise its token), the label
/// shown by `holders` while held, another token refused while it is, and the key free
/// again after each release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_uncontended_fast_paths_keep_fences_labels_and_ownership() {
    use tower_lock::LockError;
    use tower_lock::engine::{HolderLabel, Mode, Token};
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let node = engine(&server, "fast").await;
    // The first cycle leaves the tombstone; every later grant takes it.
    let first = node.lock("k").acquire().await.unwrap();
    let mut last = first.fence().get();
    first.release().await.unwrap();
    for round in 0..6u32 {
        let mode = if round % 2 == 0 {
            Mode::Exclusive
        } else {
            Mode::Shared { limit: 1 }
        };
        let label = HolderLabel::new(format!("node-{round}")).unwrap();
        let lease = node
            .lock("k")
            .in_mode(mode)
            .holder_label(label.clone())
            .acquire()
            .await
            .unwrap();
        assert_eq!(lease.fence().get(), last + 1, "round {round} ({mode:?})");
        last = lease.fence().get();
        let holders = node.lock("k").holders().await.unwrap();
        assert_eq!(holders.len(), 1, "{holders:?}");
        assert_eq!(holders[0].label.as_ref(), Some(&label), "{holders:?}");
        assert_eq!(&holders[0].token, lease.token(), "{holders:?}");
        let other = node
            .lock("k")
            .token(Token::random())
            .wait(Duration::ZERO)
            .acquire()
            .await;
        assert!(matches!(other, Err(LockError::Busy { .. })), "{other:?}");
        lease.release().await.unwrap();
        assert!(
            node.lock("k").holders().await.unwrap().is_empty(),
            "round {round}: released"
        );
    }
}
