//! The Redis backend on a redis-server of each test's own, under faults and against the
//! clock: killed, paused and restarted servers, processes killed mid-request, hand-offs
//! timed against their claim period, wake-ups by message, replica acknowledgements, and
//! runtimes that block or shut down.
//!
//! One test binary; each module is the file of one theme, its tests named as before under
//! the module's name (`cargo test --test redis_faults handoff::`). These tests used to be
//! one binary per file, and their timing bounds were measured that way: each test enters
//! its module's group first (`tower_lock_test_support::serial::group`), so a file's tests
//! run beside each other only, as before.
#![cfg(feature = "redis")]

mod arrival_order;
mod child;
mod closed_or_paused;
#[cfg(feature = "redis-cluster")]
mod cluster_idle;
#[cfg(feature = "redis-cluster")]
mod cluster_replica_restart;
#[cfg(feature = "redis-cluster")]
mod cluster_watch_dropped;
mod cycle_cost;
mod dead_tickets;
mod deadlines;
mod faults;
mod fence_bound;
mod handoff;
#[cfg(feature = "redis-cluster")]
mod lost_on_cluster_failover;
#[cfg(feature = "redis-cluster")]
mod lost_on_cluster_join;
#[cfg(feature = "redis-sentinel")]
mod lost_on_failover;
mod lost_on_reset;
mod permits;
mod record_wait;
mod refusals;
mod registrations;
mod replay;
mod replica_ack;
mod runtimes;
mod started_early;
mod vanished;
mod wakeup;
