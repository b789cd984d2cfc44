//! tower-lock-core: the framework-neutral core of [tower-lock], for the authors of
//! framework integrations.
//!
//! Applications do not depend on this crate: they configure `tower-lock`'s builders
//! (`LockLayer::builder`, `IdempotencyLayer::builder`), which re-export what they name from
//! here (keys, rejections, metrics, the option enums). An integration for a framework
//! that is not built on tower (`tower-lock-actix`) runs on the same core:
//!
//! - [`RequestLocker`]: from a request, seen through a [`RequestView`](key::RequestView),
//!   to an [`Outcome`]: run it holding a [`LockGuard`], run it unlocked, or answer with a
//!   [`Rejection`]; then, once the response head is known, [`LockGuard::after_head`]
//!   decides when the lease is released;
//! - with the `idempotency` feature, [`ReplayLocker`]: idempotency with response replay,
//!   the protocol written once here.
//!
//! The crate's parts: [`key`] (key extractors), [`reject`] (rejections), [`metrics`], the
//! option enums ([`MissingKeyPolicy`], [`BackendFailurePolicy`], [`ReleasePoint`]),
//! [`ConfigError`], [`LeaseInfo`], [`NotStored`], and the lock engine ([`engine`], the
//! `tower-lock-engine` crate re-exported), which knows nothing of HTTP.
//!
//! [tower-lock]: https://docs.rs/tower-lock

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod config_error;
mod grpc;
mod integration;
pub mod key;
mod lease_info;
pub mod metrics;
mod not_stored;
mod options;
pub mod reject;
mod retry_after;
#[doc(hidden)]
pub mod settings;

/// The `bytes` crate of this crate's API.
pub use bytes;
pub use config_error::ConfigError;
/// The `http` crate (1.x) of this crate's API.
pub use http;
pub use integration::*;
pub use lease_info::LeaseInfo;
pub use metrics::LockMetrics;
pub use not_stored::NotStored;
pub use options::{BackendFailurePolicy, MissingKeyPolicy, ReleasePoint};
pub use reject::{Rejection, RejectionKind};
/// The lock engine (the `tower-lock-engine` crate): leases on string keys, Redis or
/// in-process; it knows nothing of HTTP.
pub use tower_lock_engine as engine;
// The engine's errors by short paths, for the modules that name them often.
use tower_lock_engine::{KeyError, LockError};
