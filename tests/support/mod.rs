//! Shared test fixtures: the conformance suite, and (with the Redis backend) a redis-server
//! started on a free loopback port for the test run.
#![allow(dead_code, unreachable_pub)]

pub mod conformance;
pub mod redis;
