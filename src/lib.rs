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

pub mod engine;
mod error;

pub use engine::{
    Fence, Lease, Lock, LockEngine, LockKey, LockOptions, LostSignal, MemoryBackend, Token,
};
pub use error::{BackendError, BackendErrorKind, KeyError, LockError};
