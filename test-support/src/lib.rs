//! The tower-lock workspace's shared test fixtures (not published).
//!
//! | module | what it holds | used by |
//! | --- | --- | --- |
//! | [`redis`] | a `redis-server` of the test's own on a free port (kill, restart, pause, freeze, `redis-cli`, SCAN); engines on it and what they leave behind | every Redis test |
//! | [`scripted`] | the in-process backend with hooks that hold or fail chosen calls | `tests/lease_lifecycle.rs`, the core-only conformance run |
//! | [`conformance`] | the engine conformance suite, `conformance_tests!` / `core_conformance_tests!`, a harness per backend | `tests/conformance_*.rs` |
//!
//! # One tower-lock
//!
//! This crate depends on `tower-lock`, and the workspace's crates use it as
//! a dev-dependency: a dev-dependency cycle, which cargo allows. Its APIs name
//! tower-lock's types (`LockEngine`, `Backend`), and that is sound because it is only used
//! from *integration tests* (`tests/*.rs` of each crate): an integration test links the
//! same build of `tower-lock` as this crate does, so the `LockEngine` made here is the
//! test's `LockEngine`. A unit test inside `src/` (`#[cfg(test)]`) is compiled against a
//! second build of the library, whose types differ from the ones named here (`expected
//! LockEngine, found tower_lock::LockEngine`): never use this crate from a unit test.
//!
//! Which backend the library is built with stays the choice of the crate under test: this
//! crate depends on `tower-lock` without default features, and its `redis` feature (what
//! names `RedisBackend`: engines on a test server, the Redis harness) is turned on by the
//! root crate's own `redis` feature (a feature may enable a dev-dependency's feature;
//! `cargo package` drops the reference) and always by the integration crates. `cargo test
//! --no-default-features` therefore still builds the library without Redis.

pub mod conformance;
pub mod redis;
pub mod scripted;
