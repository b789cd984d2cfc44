//! Scale and endurance under faults: a Redis Cluster (a failover, a frozen primary, a
//! killed primary), a Sentinel-managed primary that fails over, and the exclusion and
//! permit soaks on Redis and in memory, each checked through its recorded history.
//!
//! One test binary; each module is the file of one theme, its tests named as before under
//! the module's name (`cargo test --test scale cluster_paused::`). Each Cluster and Sentinel
//! test starts servers of its own and used to be the only one in its binary: each test
//! enters its module's group first (`tower_lock_test_support::serial::group`), so a file's
//! tests run beside each other only, as before.

#[cfg(feature = "redis-cluster")]
mod cluster_failover;
#[cfg(feature = "redis-cluster")]
mod cluster_paused;
#[cfg(feature = "redis-cluster")]
mod cluster_primary_killed;
mod exclusion_soak;
mod fault_schedule;
mod permit_soak;
#[cfg(feature = "redis-sentinel")]
mod sentinel_failover;
