//! For framework integrations: the framework-neutral core of the middleware, from a
//! request to "run it holding this lease", "run it unlocked" or "answer with this
//! rejection".
//!
//! A [`RequestLocker`] holds a layer's configuration and its shared state (the engine, the
//! in-process fallback engine, the metrics). The tower `LockLayer` is
//! a thin shell over it; an integration for another framework (`tower-lock-actix`) shows
//! it each request through its own [`RequestView`](crate::key::RequestView), calls
//! [`RequestLocker::acquire`] and maps the [`Outcome`] onto its own types, keeping the
//! [`LockGuard`] until the response head is known. There [`LockGuard::after_head`] decides,
//! for every framework alike, whether the lease is released, released before the response
//! is handed over, or held until the body ends ([`AfterHead`]).
//!
//! With the `idempotency` feature, [`ReplayLocker`] is the same for idempotency replay,
//! with the protocol written once: a framework implements a small [`ReplayAdapter`] and
//! the [`ReplayFuture`] of [`ReplayLocker::serve`] drives each request.
//!
//! Applications do not need this module: they configure a
//! `LockLayerBuilder` and install the layer (or the
//! integration's middleware).
//!
//! ```
//! use tower_lock::{LockEngine, LockLayer, key::PathKey};
//! use tower_lock_core::Outcome;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let locker = LockLayer::builder(LockEngine::in_memory()).key(PathKey).build_locker().unwrap();
//! let req = http::Request::builder().uri("/reports/7").body(()).unwrap();
//! match locker.acquire(&req).await {
//!     Outcome::Locked(guard) => println!("run the handler holding {}", guard.info().key()),
//!     Outcome::Unlocked => println!("run the handler without a lock"),
//!     Outcome::Observed(info) => println!("a dry run: run it unlocked, with {info:?}"),
//!     Outcome::Rejected(rejection) => println!("answer {}", locker.respond(rejection, &req).status()),
//! }
//! # }
//! ```

mod acquisition;
mod after_head;
mod config;
mod dry_run;
mod guard;
pub(crate) mod hold_log;
mod layer_names;
mod locker;
mod log_throttle;
mod methods;
mod misconfig_log;
mod outage;
mod outcome;
mod route_labels;
mod sharing;
mod unrouted;
// Gated once here; its public items are re-exported below.
#[cfg(feature = "idempotency")]
pub(crate) mod replay;

pub use acquisition::Acquisition;
pub use after_head::{AfterHead, Release};
pub(crate) use config::{Config, RejectHook};
pub(crate) use dry_run::DRY_RUN_MARK;
pub use guard::LockGuard;
pub use locker::RequestLocker;
#[doc(hidden)]
pub use log_throttle::LogThrottle;
pub(crate) use methods::{LockedMethods, is_miscased};
pub use outcome::Outcome;
#[cfg(feature = "idempotency")]
#[doc(hidden)]
pub use replay::AcceptedCodings;
#[cfg(feature = "idempotency")]
#[cfg_attr(docsrs, doc(cfg(feature = "idempotency")))]
pub use replay::{
    BodyRead, CapturingBody, Chunk, ChunkSource, Leftover, RecordSummary, ReplayAdapter,
    ReplayFuture, ReplayLocker, ReplayedTrailers, fingerprint::FingerprintFn,
};
pub(crate) use sharing::Sharing;
