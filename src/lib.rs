//! tower-lock: serialize HTTP handlers per key, on a shared lock engine.
//!
//! The [`engine`] module is the lock engine (Redis or in-process); it knows nothing of HTTP.
//!
//! ```
//! use tower_lock::LockEngine;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_lock::LockError> {
//! let engine = LockEngine::in_memory();
//! let lease = engine.lock("tenant:7").acquire().await?;
//! assert!(engine.lock("tenant:7").locked().await?);
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```

mod body;
pub mod engine;
mod error;
mod future;
pub mod key;
mod layer;
pub mod metrics;
mod policy;
pub mod reject;
mod service;

pub use body::LockedBody;
pub use engine::{
    Fence, Lease, Lock, LockEngine, LockKey, LockOptions, LostSignal, MemoryBackend, Token,
};
pub use error::{BackendError, BackendErrorKind, KeyError, LockError};
pub use future::ResponseFuture;
pub use layer::{ConfigError, LockLayer, LockLayerBuilder};
pub use metrics::LockMetrics;
pub use policy::{
    BackendFailurePolicy, HeldLock, LeaseInfo, LockPolicy, MissingKeyPolicy, Outcome, RejectHook,
    ReleasePoint,
};
pub use reject::{Rejection, RejectionKind};
pub use service::LockService;
