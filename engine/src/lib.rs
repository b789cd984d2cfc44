//! tower-lock-engine: fair, fenced, auto-renewed leases on string keys, with no knowledge
//! of HTTP (the lock engine of `tower-lock`, which re-exports it as `tower_lock::engine`).
//!
//! A [`LockEngine`] is a cheap-to-clone handle over a [`Backend`]: the in-process
//! [`MemoryBackend`] for a single node, or the Redis backend for a fleet. [`LockEngine::lock`]
//! gives a [`Lock`] handle on one key; acquiring it yields a [`Lease`], an RAII guard that
//! is renewed by the engine's watchdog while it lives and released when dropped.
//!
//! One acquisition model: a request has a [`Mode`], the key's lock ([`Mode::Exclusive`],
//! the default) or one of its shared leases (`engine.lock(k).shared(n)`: up to `n` holders
//! at once; `shared(1)` holds alone, as the lock does). A key's lock and its shared leases
//! exclude each other: one space and one queue per key for both modes, so readers on
//! `shared(n)` and writers on the lock make a read-write lock.
//!
//! ```
//! use std::time::Duration;
//! use tower_lock_engine::LockEngine;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_lock_engine::LockError> {
//! let engine = LockEngine::in_memory();
//! let lease = engine
//!     .lock("invoice:42")
//!     .ttl(Duration::from_secs(10))
//!     .wait(Duration::from_secs(2))
//!     .acquire()
//!     .await?;
//! // Pass the fencing token to storage so it can refuse writes from stale holders.
//! println!("holding {} with fence {}", lease.key(), lease.fence());
//! assert!(engine.lock("invoice:42").try_acquire().await.is_err());
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Writing a backend
//!
//! A backend implements [`Backend`]: six methods covering both modes (an atomic acquire
//! that may wait and must clean up after itself when its future is dropped, compare-token
//! release / extend / batched renew, holder and waiter inspection); one without shared
//! mode says so ([`Backend::has_shared_mode`]) and the engine answers
//! [`LockError::Unsupported`] for it. Admin operations,
//! numeric compare-and-set, lock pools and records are optional capability traits
//! ([`AdminBackend`], [`NumericBackend`], [`PoolBackend`], [`RecordBackend`]) a backend
//! reports through [`Backend::capabilities`]; the engine answers
//! [`LockError::Unsupported`] for the ones it lacks. The conformance suite (the
//! `conformance` module, feature `conformance`) runs its core cases unchanged against every
//! backend in each mode it has, and the capability cases against backends that have them.
//!
//! # Features
//!
//! - `redis`: the Redis backend ([`redis::RedisBackend`]); `redis-tls`, `redis-cluster`
//!   and `redis-sentinel` add TLS, Redis Cluster and Sentinel to it.
//! - `postgres`: the Postgres backend ([`postgres::PostgresBackend`]): everything but
//!   permits in this version.
//! - `conformance`: the backend conformance suite, for a backend's own tests.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod admin;
#[cfg(test)]
mod altered;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod armed;
mod backend;
mod completion;
mod config_error;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod error;
mod holder;
mod key;
mod label;
mod lease;
mod lock;
mod lock_engine;
mod lock_pool;
mod lost;
mod memory;
mod mode;
mod mutex;
mod numeric;
mod options;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod record;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod releasing;
mod resets;
pub mod runtime;
mod status;
mod watchdog;

pub use admin::{ActiveKey, LockAdmin};
pub(crate) use backend::SynchronousBackend;
pub use backend::{
    AcquireRequest, AdminBackend, Backend, BoxFuture, Capabilities, Grant, GrantOrRecord, Holder,
    NumericBackend, PoolBackend, PoolHolders, RecordBackend, Renewal,
};
pub use config_error::ConfigError;
pub use error::{BackendError, BackendErrorKind, KeyError, LockError};
pub use key::{Fence, LockKey, MAX_KEY_LEN, MAX_TOKEN_LEN, Token};
pub use label::{HolderLabel, MAX_LABEL_LEN};
pub use lease::Lease;
pub use lock::Lock;
pub use lock_engine::LockEngine;
pub use lock_pool::{LockPool, PoolHealth, PoolOp};
pub use lost::LostSignal;
pub use memory::MemoryBackend;
pub use mode::Mode;
pub use mutex::{KeyMutex, MutexError};
pub use numeric::{Compare, NumericAction, NumericKey, NumericOp};
pub use options::{ExtendMode, LockOptions, MAX_TTL, MIN_TTL};
pub use record::{Acquired, Record};
pub(crate) use record::{from_unix_millis, unix_millis};
pub use resets::Resets;
pub use status::LockStatus;

// The README's code block compiles as a doctest (it names the Redis backend), so it cannot
// drift from the API.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
