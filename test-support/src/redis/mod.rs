//! A `redis-server` of the test's own on a free loopback port, and (with the `redis`
//! feature) engines on it and a check of what they leave behind.

mod cluster;
mod guardian;
mod replicated;
mod sentinel;
mod server;
mod tls;

pub use cluster::RedisCluster;
pub use replicated::Replicated;
pub use sentinel::{SERVICE, Sentineled};
pub use server::RedisServer;
pub use tls::TlsRedis;

#[cfg(feature = "redis")]
mod engine;

#[cfg(feature = "redis")]
pub use engine::{engine, is_fence_tombstone, residue};
