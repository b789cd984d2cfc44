//! The tower-lock workspace's shared test fixtures and HTTP scenarios (not published).
//!
//! | module | what it holds | used by |
//! | --- | --- | --- |
//! | [`redis`] | a `redis-server` of the test's own on a free port (kill, restart, pause, freeze, `redis-cli`, SCAN); engines on it and what they leave behind | every Redis test |
//! | [`postgres`] | a throwaway Postgres cluster (`initdb` as the `postgres` user, a free port, a private socket directory; kill, restart, pause, resume) and a PgBouncer in transaction mode in front of it | `tests/postgres`, the scenarios' [`Backend::Postgres`](scenarios::Backend) and `PostgresBouncer`, the contention bench's Postgres runs |
//! | [`http`] | a test app on a real socket (axum or actix), a hyper-util client, [`Reply`](http::Reply), a channel-fed body for either framework | every HTTP test |
//! | [`gate`] | a gate handlers wait at until the test lets them through, counting who is inside | the scenarios, the Redis fault tests |
//! | [`unavailable`] | a backend that is always down | the failure-policy scenarios |
//! | [`scripted`] | the in-process backend with hooks that hold or fail chosen calls | `tests/engine` (`lease_lifecycle`, the core-only conformance run), `tests/layer/outage_log.rs`, `tests/replay/tower_level.rs` |
//! | [`conformance`] | the engine's conformance suite (`tower_lock_engine::conformance`, with `conformance_tests!` / `core_conformance_tests!`) re-exported, and the harnesses of the core-only and Redis backends | `tests/engine/conformance_*.rs` |
//! | [`prefix`] | a key prefix of its own on a shared server, for every scenario table, conformance harness and test that shares the binary's redis-server or Cluster | the scenarios' [`Backend`](scenarios::Backend), [`conformance`], `tests/engine/conformance_redis.rs` |
//! | [`occupancy`] | who is inside one key's handlers at once, shared or exclusive, and every violation of the permits' promises | `tests/layer/permits.rs`, `tests/integrations/permits.rs` |
//! | [`scenarios`] | the HTTP scenarios, each written once; `http_scenarios!`, `parity_scenarios!`, `unavailable_backend_scenarios!`, `replay_scenarios!` | `tests/layer`, `tests/replay`, `tests/integrations` |
//! | [`cycling`] | workers cycling one lock under faults, checking exclusion, fences and answer times on every grant | the Cluster and Sentinel fault tests (`tests/scale`) |
//! | [`history`] | a soak's recorded history (acquisitions, fenced-register writes, force releases) and its checker: exclusion, fences, the register, FIFO, each printing the window that breaks it | `tests/scale/exclusion_soak.rs`, `tests/scale/permit_soak.rs`, `tests/redis_faults/permits.rs` (the paused-Redis permit run) |
//! | [`fallbacks`] | counts the waiters served by the fallback timer rather than by a wake-up message | the wake-up, runtime, Cluster and Sentinel tests (`tests/redis_faults`, `tests/scale`) |
//! | [`scratch`] | scratch directories and files in `/tmp`, removed when the test process exits however it exits | the Postgres, Cluster, Sentinel, TLS and stepped-clock fixtures, `tests/transactional`'s marks, `tests/redis_faults/lost_on_cluster_join.rs` |
//! | [`serial`] | a process-wide gate: the fault tests of one group never run beside another group's | every test of `tests/redis_faults` and `tests/scale` |
//!
//! The workspace's integration tests are a few binaries by theme, each a `tests/<theme>/`
//! folder whose `main.rs` names its modules: `engine` (the conformance runs, the lease's
//! machinery, bring-your-own Redis settings), `layer` (the lock layer, from `poll` to real
//! sockets, on every backend), `replay` (idempotency replay), `redis_faults` (the Redis
//! backend on a server of each test's own, under faults), `scale` (Cluster, Sentinel, the
//! soaks), `integrations` (tower-lock-axum and tower-lock-actix) and `examples`.
//!
//! # One tower-lock
//!
//! This crate depends on `tower-lock` (and `tower-lock-actix`), and `tower-lock` uses it as
//! a dev-dependency: a dev-dependency cycle, which cargo allows. Its APIs name
//! tower-lock's types (`LockEngine`, `LockLayer`, `Backend`), and that is sound because it
//! is only used from *integration tests* (`tests/` of the root crate): an integration test
//! links the same build of `tower-lock` as this crate does, so the `LockEngine` made here
//! is the test's `LockEngine`. A unit test inside `src/` (`#[cfg(test)]`) is compiled
//! against a second build of the library, whose types differ from the ones named here
//! (`expected LockEngine, found tower_lock::LockEngine`): never use this crate from a unit
//! test. (The alternative, a crate that names no tower-lock type and expands every
//! scenario from a macro in the test crate, would work from unit tests too, but no unit
//! test needs it, and scenarios written as plain functions are checked, linted and read
//! once, here.)
//!
//! Which backend the library is built with stays the choice of the crate under test: this
//! crate depends on `tower-lock` without default features. Its `redis` feature (what
//! names `RedisBackend`: engines on a test server, the Redis harness, the scenarios'
//! [`Backend::Redis`](scenarios::Backend)) and `redis-cluster` feature reach the Redis
//! backend through `tower-lock-engine` directly (the engine `tower-lock` re-exports, so
//! its types are the test's), and the root crate's tests always turn them on: no feature
//! of tower-lock's, which users see, names this unpublished crate. `cargo test
//! --no-default-features` still builds the library without its `redis` feature, and the
//! tests that need Redis are `cfg`-gated on that feature. Its `postgres` feature does the
//! same for the scenarios' Postgres backends.
//!
//! # Scenarios
//!
//! A scenario is an `async fn` in [`scenarios`] that takes the [`Stack`](scenarios::Stack)
//! it runs on: the [`Framework`](scenarios::Framework) (the tower layer under axum, or the
//! actix middleware) and the [`Backend`](scenarios::Backend) (in-process, Redis or
//! Postgres). A test
//! file instantiates the whole list with one macro call, one `#[tokio::test]` per
//! scenario, named as the scenario, the way `conformance_tests!` does for the engine:
//!
//! ```ignore
//! tower_lock_test_support::http_scenarios!(framework = tower, backend = Redis);
//! ```

#![forbid(unsafe_code)]

pub mod conformance;
pub mod cycling;
pub mod fallbacks;
pub mod gate;
mod guarded;
pub mod history;
pub mod http;
pub mod occupancy;
pub mod postgres;
pub mod prefix;
pub mod redis;
pub mod scenarios;
pub mod scratch;
pub mod scripted;
pub mod serial;
pub mod unavailable;

// The suite's macros, where the test files have always found them.
pub use tower_lock_engine::{conformance_tests, core_conformance_tests, shared_conformance_tests};
