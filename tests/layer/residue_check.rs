//! The residue check of a Redis table: a fence tombstone is documented and short-lived (it
//! has a TTL), so one that expires while the check reads its TTL is gone, as its TTL
//! promised, not a key left without one; a tombstone with no TTL is still refused.
#![cfg(feature = "redis")]

use std::panic::{AssertUnwindSafe, catch_unwind};

use tower_lock_test_support::{
    prefix,
    redis::{RedisServer, residue},
};

/// A fence tombstone's key under `prefix`.
fn tombstone(prefix: &str, i: usize) -> String {
    format!("{prefix}:{{t}}:fence:{i}")
}

#[test]
fn a_tombstone_that_expires_while_the_check_reads_it_is_no_residue() {
    let server = RedisServer::shared();
    let prefix = prefix::unique("expiring-tombstones");
    // Expiries spread over the time the check takes to read the TTLs one by one (a
    // `redis-cli` each), so some tombstones it listed are gone when it asks for their TTL.
    let commands: Vec<Vec<String>> = (0..200)
        .map(|i| {
            let px = (20 + 2 * i).to_string();
            ["SET", &tombstone(&prefix, i), "1", "PX", &px]
                .map(str::to_owned)
                .to_vec()
        })
        .collect();
    let commands: Vec<Vec<&str>> = commands
        .iter()
        .map(|c| c.iter().map(String::as_str).collect())
        .collect();
    let commands: Vec<&[&str]> = commands.iter().map(Vec::as_slice).collect();
    server.cli_pipe(&commands);
    assert_eq!(residue(server, &prefix), Vec::<String>::new());
}

#[test]
fn a_tombstone_without_a_ttl_is_still_refused() {
    let server = RedisServer::shared();
    let prefix = prefix::unique("immortal-tombstone");
    let key = tombstone(&prefix, 0);
    server.cli(["SET", &key, "1"]);
    let checked = catch_unwind(AssertUnwindSafe(|| residue(server, &prefix)));
    server.cli(["DEL", &key]);
    assert!(checked.is_err(), "a tombstone with no TTL passed the check");
}
