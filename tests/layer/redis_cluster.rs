//! The layer through a real server socket, on the Redis backend on a Redis Cluster: the
//! HTTP scenarios (written once in `tower-lock-test-support`) on a shared test cluster,
//! each under its own key prefix.
#![cfg(feature = "redis-cluster")]

tower_lock_test_support::http_scenarios!(framework = tower, backend = RedisCluster);
