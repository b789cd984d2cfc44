//! HTTP helpers shared by the layer's test files (a test app on a real socket). The other
//! fixtures live in the `tower-lock-test-support` crate.
#![allow(dead_code, unreachable_pub)]

pub mod http;
