//! Shared test fixtures: the conformance suite, HTTP helpers (a test app on a real socket),
//! and (with the Redis backend) a redis-server started on a free loopback port for the
//! test run.
#![allow(dead_code, unreachable_pub)]

pub mod conformance;
pub mod http;
pub mod redis;
pub mod scripted;
