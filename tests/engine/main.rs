//! The lock engine, without HTTP: the conformance suite on every backend (in process, a
//! core-only backend, Redis, a Redis Cluster), the lease's process-local machinery under
//! the interleavings that break exclusion, and the Redis backend on connection settings the
//! application already has.
//!
//! One test binary; each module is the file of one theme, its tests named as before under
//! the module's name (`cargo test --test engine conformance_redis::`).

mod conformance_core_only;
mod conformance_memory;
#[cfg(feature = "redis")]
mod conformance_redis;
#[cfg(feature = "redis-cluster")]
mod conformance_redis_cluster;
mod fifo_line;
mod lease_lifecycle;
#[cfg(feature = "redis")]
mod redis_bring_your_own;
#[cfg(feature = "redis")]
mod redis_config_errors;
mod refused_completion;
