//! The lock layer: at the poll level (tower-test mocks, a paused clock), through a real
//! socket on every backend (the HTTP scenarios written once in `tower-lock-test-support`,
//! and the Redis outages), and each of its policies on its own (key extractors and their
//! namespaces, methods, problem+json bodies, `Retry-After`, outage logs).
//!
//! One test binary; each module is the file of one theme, its tests named as before under
//! the module's name (`cargo test --test layer redis::`).

mod across_routes;
mod compression_inside;
mod dashboard;
mod dry_run;
mod extractors;
mod fallback;
mod grpc;
mod hold_metrics;
mod in_process;
mod key_kinds;
mod key_namespace;
mod layer_names;
mod log_capture;
mod long_scopes;
mod methods;
mod outage_log;
mod permits;
mod poll;
#[cfg(feature = "postgres")]
mod postgres;
mod problem_json;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis-cluster")]
mod redis_cluster;
mod residue_check;
mod retry_after;
mod scenario_tables;
