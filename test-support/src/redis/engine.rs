//! Engines on a test redis-server, and what they leave behind.

use std::time::Duration;

use tower_lock::LockEngine;
use tower_lock_engine::redis::RedisBackend;

use super::RedisServer;

/// An engine (a node: its own connection pool and subscriber) on `server`, its keys under
/// `prefix`, with the backend's default command timeout or `timeout`.
pub async fn engine(server: &RedisServer, prefix: &str, timeout: Option<Duration>) -> LockEngine {
    let mut builder = RedisBackend::builder(server.url()).prefix(prefix);
    if let Some(timeout) = timeout {
        builder = builder.command_timeout(timeout);
    }
    LockEngine::new(
        builder
            .build()
            .await
            .expect("connect to the test redis-server"),
    )
}

/// Whether `key` is a fence tombstone (a lock's `fence`, or permits' `pfence`):
/// documented, short-lived (it has a TTL), and kept so that fences never repeat.
pub fn is_fence_tombstone(key: &str) -> bool {
    key.split_once("}:")
        .is_some_and(|(_, rest)| rest.starts_with("fence:"))
}

/// What is left of the claim a hand-off's fence key `key` records (`<fence>@<expiry ms>`,
/// by the server's clock), 0 for any other tombstone.
fn claim_left_ms(server: &RedisServer, key: &str) -> i64 {
    let value = server.cli(["GET", key]);
    let Some(expiry) = value
        .split_once('@')
        .and_then(|(_, e)| e.trim().parse::<i64>().ok())
    else {
        return 0;
    };
    let time = server.cli(["TIME"]);
    let mut parts = time
        .split_whitespace()
        .map(|p| p.parse::<i64>().unwrap_or(0));
    let (secs, micros) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (expiry - (secs * 1000 + micros / 1000)).max(0)
}

/// The keys under `prefix` other than fence tombstones, each of which must carry a TTL
/// (blocking: `redis-cli`).
pub fn residue(server: &RedisServer, prefix: &str) -> Vec<String> {
    let mut left = Vec::new();
    for key in server.scan(&format!("{prefix}:*")) {
        if is_fence_tombstone(&key) {
            // -1: no TTL. -2: gone, expired since the scan listed it, as its TTL promised.
            let ttl: i64 = server.cli(["PTTL", &key]).parse().unwrap();
            assert_ne!(ttl, -1, "tombstone {key} has no TTL");
            // A tombstone outlives its release by at most 10 s, on every path; a hand-off's
            // fence (`<fence>@<claim expiry ms>`) outlives its claim by as much, so while a
            // claim to a waiter that is gone still runs, it may live that much longer.
            let claim_left = claim_left_ms(server, &key);
            assert!(
                ttl <= 10_000 + claim_left,
                "tombstone {key} lives {ttl} ms more, over 10 s (claim left: {claim_left} ms)"
            );
        } else {
            left.push(key);
        }
    }
    left
}
